package crashtest_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/crashtest"
)

// TestFreshDatabase: each call gives a migrated database no other call
// sees, on the server in ONCEFLOW_DATABASE_URL, and the database is gone
// when the test that asked for it ends.
func TestFreshDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var names [2]string
	t.Run("two worlds", func(t *testing.T) {
		a, b := crashtest.FreshDatabase(t, ""), crashtest.FreshDatabase(t, "")
		_, err := a.Exec(ctx, `INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, owner, locked_until)
			VALUES ('t', 'k', gen_random_uuid(), 'w', decode(repeat('00', 32), 'hex'), gen_random_uuid(), now())`)
		require.NoError(t, err, "the database is migrated")
		var inB int
		require.NoError(t, b.QueryRow(ctx, `SELECT count(*) FROM onceflow_keys`).Scan(&inB))
		require.Zero(t, inB, "the other world does not see the row")
		require.NoError(t, a.QueryRow(ctx, `SELECT current_database()`).Scan(&names[0]))
		require.NoError(t, b.QueryRow(ctx, `SELECT current_database()`).Scan(&names[1]))
		require.NotEqual(t, names[0], names[1])
	})

	server, err := pgx.Connect(ctx, os.Getenv(crashtest.ServerEnv))
	require.NoError(t, err)
	defer server.Close(ctx)
	var left int
	require.NoError(t, server.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = ANY($1)`, names[:]).Scan(&left))
	require.Zero(t, left, "the databases are dropped when their test ends")
}

func TestNewDatabasesWithoutServer(t *testing.T) {
	t.Setenv(crashtest.ServerEnv, "")
	_, err := crashtest.NewDatabases("")
	require.ErrorIs(t, err, crashtest.ErrNoServer)
	require.ErrorContains(t, err, "ONCEFLOW_DATABASE_URL")
}
