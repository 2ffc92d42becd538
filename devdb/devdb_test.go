package devdb_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/devdb"
)

// TestThrowawayServer: without ONCEFLOW_DATABASE_URL, URL starts a server
// that answers, and stop ends it.
func TestThrowawayServer(t *testing.T) {
	t.Setenv("ONCEFLOW_DATABASE_URL", "")
	t.Setenv("DATABASE_URL", "")
	ctx := context.Background()
	url, stop, err := devdb.URL(ctx)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	var one int
	require.NoError(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.Equal(t, 1, one)
	require.NoError(t, conn.Close(ctx))

	stop()
	_, err = pgx.Connect(ctx, url)
	require.Error(t, err, "the server is gone after stop")
}

// TestURLFromTheEnvironment: a URL in ONCEFLOW_DATABASE_URL is used as it
// is, and nothing is started.
func TestURLFromTheEnvironment(t *testing.T) {
	const given = "postgres://app@db.internal:5432/app"
	t.Setenv("ONCEFLOW_DATABASE_URL", given)
	url, stop, err := devdb.URL(context.Background())
	require.NoError(t, err)
	require.Equal(t, given, url)
	stop()
}
