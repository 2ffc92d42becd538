package pgbouncer_test

import (
	"context"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/pgbouncer"
	"github.com/onceflow/onceflow/internal/pgcluster"
)

// TestTransactionPooling: clients of the bouncer share its server
// connections one transaction at a time, with the pgx settings URL gives
// them; Stop removes the bouncer and its directory.
func TestTransactionPooling(t *testing.T) {
	ctx := context.Background()
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	b, err := pgbouncer.Start(ctx, pgbouncer.Options{Server: cluster.URL(), PoolSize: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Stop() })
	require.Contains(t, b.URL("postgres"), "default_query_exec_mode="+pgbouncer.QueryExecMode)

	cfg, err := pgxpool.ParseConfig(b.URL("postgres"))
	require.NoError(t, err)
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()

	// Sixteen clients, two server connections: each transaction runs whole
	// on one of them, with statements and arguments of every kind onceflow
	// sends (json from []byte, uuid, timestamps), the same statement text
	// again and again.
	_, err = pool.Exec(ctx, `CREATE TABLE docs (id int PRIMARY KEY, doc jsonb NOT NULL, at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		pids = map[int32]bool{}
		errs []error
	)
	for i := range 16 {
		wg.Go(func() {
			for j := range 10 {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var pid int32
					if err := tx.QueryRow(ctx, `INSERT INTO docs (id, doc) VALUES ($1, $2) RETURNING pg_backend_pid()`,
						i*10+j, []byte(`{"n":1}`)).Scan(&pid); err != nil {
						return err
					}
					var same int32
					if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&same); err != nil {
						return err
					}
					mu.Lock()
					defer mu.Unlock()
					pids[pid] = true
					if same != pid {
						errs = append(errs, pgx.ErrTxClosed) // a transaction split over two server connections
					}
					return nil
				})
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, errs)
	require.LessOrEqual(t, len(pids), 2, "no more server connections than the pool's size")
	var rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM docs WHERE doc = '{"n":1}'`).Scan(&rows))
	require.Equal(t, 160, rows, "every json argument arrived as json")

	// The admin console sees the pool in transaction mode.
	admin, err := pgx.Connect(ctx, b.AdminURL())
	require.NoError(t, err)
	defer admin.Close(ctx)
	modes := map[string]any{} // database -> pool_mode
	adminRows, err := admin.Query(ctx, `SHOW POOLS`)
	require.NoError(t, err)
	for adminRows.Next() {
		values, err := adminRows.Values()
		require.NoError(t, err)
		row := map[string]any{}
		for i, fd := range adminRows.FieldDescriptions() {
			row[fd.Name] = values[i]
		}
		modes[row["database"].(string)] = row["pool_mode"]
	}
	require.NoError(t, adminRows.Err())
	mode, found := modes["postgres"]
	require.True(t, found, "the pool of database postgres")
	require.Equal(t, "transaction", mode)

	pool.Close()
	require.NoError(t, b.Stop())
	require.NoError(t, b.Stop(), "Stop is safe to call twice")
	_, err = os.Stat(b.Dir())
	require.True(t, os.IsNotExist(err), "the bouncer's directory is removed")
	_, err = pgx.Connect(ctx, b.URL("postgres"))
	require.Error(t, err, "the bouncer is gone")
}

func TestStartNeedsAServer(t *testing.T) {
	_, err := pgbouncer.Start(context.Background(), pgbouncer.Options{})
	require.ErrorContains(t, err, "Options.Server is required")
}
