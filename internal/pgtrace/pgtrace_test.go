package pgtrace_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/pgtrace"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestCountsCommitsAsPostgreSQLDoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(dbtest.NewDatabase(t, dbtest.Options{}))
	require.NoError(t, err)
	counter := &pgtrace.Counter{}
	cfg.Tracer = counter
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)

	step := func(name string, wantStatements, wantBatches, wantCommits int64, run func()) {
		t.Helper()
		before := counter.Counts()
		run()
		got := counter.Counts().Sub(before)
		require.Equal(t, pgtrace.Counts{Statements: wantStatements, Batches: wantBatches, Commits: wantCommits}, got, name)
	}
	step("a statement on its own is a transaction", 1, 0, 1, func() {
		_, err := conn.Exec(ctx, `CREATE TABLE t (n int)`)
		require.NoError(t, err)
	})
	step("a read on its own commits too", 1, 0, 1, func() {
		var n int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n))
	})
	step("a transaction block commits once", 3, 0, 1, func() {
		require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO t VALUES (1)`)
			return err
		}))
	})
	step("a block with options commits once", 3, 0, 1, func() {
		require.NoError(t, pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO t VALUES (1)`)
			return err
		}))
	})
	step("a rolled-back block commits nothing", 3, 0, 0, func() {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO t VALUES (2)`)
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
	})
	step("a failed statement commits nothing", 1, 0, 0, func() {
		_, err := conn.Exec(ctx, `INSERT INTO t VALUES ('x')`)
		require.Error(t, err)
	})
	step("a batch outside a block is one implicit transaction", 0, 1, 1, func() {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO t VALUES (3)`)
		b.Queue(`INSERT INTO t VALUES (4)`)
		require.NoError(t, conn.SendBatch(ctx, b).Close())
	})
	step("a batch holding its own block commits once", 0, 1, 1, func() {
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(`INSERT INTO t VALUES (5)`)
		b.Queue(`COMMIT`)
		require.NoError(t, conn.SendBatch(ctx, b).Close())
	})
	step("a batch that opens a block commits nothing yet", 1, 1, 1, func() {
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(`INSERT INTO t VALUES (6)`)
		require.NoError(t, conn.SendBatch(ctx, b).Close())
		_, err := conn.Exec(ctx, `COMMIT`)
		require.NoError(t, err)
	})
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n))
	require.Equal(t, 6, n)
}
