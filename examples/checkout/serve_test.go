package main

import (
	"context"
	"net"
	"os/exec"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/migrations"
)

// TestServePrintsItsThrowawayDatabase: without --database-url, serve prints
// the URL of the database it started, migrated, with the checkout's tables,
// for the onceflow command line.
func TestServePrintsItsThrowawayDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, err := startServe(ctx, binary)
	require.NoError(t, err)
	t.Cleanup(p.Kill)
	require.NotEmpty(t, p.DBURL, "serve printed no export ONCEFLOW_DATABASE_URL=")

	conn, err := pgx.Connect(ctx, p.DBURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	m, err := migrations.New(conn, migrations.Config{})
	require.NoError(t, err)
	require.NoError(t, m.Check(ctx))
	var orders int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM checkout_orders`).Scan(&orders))
}

// TestServeBindsItsPortFirst: a port in use fails serve before it starts a
// PostgreSQL of its own.
func TestServeBindsItsPortFirst(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	out, err := exec.Command(binary, "serve", "--addr", taken.Addr().String()).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "address already in use")
	require.NotContains(t, string(out), "ONCEFLOW_DATABASE_URL", "no database was started")
}

// TestServeRefusesAnUnknownKeySource: --derive-keys-from takes record or
// client-key, and anything else stops serve before it starts anything.
func TestServeRefusesAnUnknownKeySource(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(binary, "serve", "--addr", "127.0.0.1:0", "--derive-keys-from", "record-id").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), `--derive-keys-from: "record-id" is not a key source (record or client-key)`)
	require.NotContains(t, string(out), "ONCEFLOW_DATABASE_URL", "no database was started")
}
