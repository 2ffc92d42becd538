package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/sweeper"
)

// seed inserts n finished records, finished age ago.
func seed(ctx context.Context, db *database, n int, age string) error {
	_, err := db.pool.Exec(ctx, `
		INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, owner, status, response_status,
			response_body, created_at, updated_at, completed_at)
		SELECT 'seed', 'seed-' || i, gen_random_uuid(), 'op', sha256(i::text::bytea), gen_random_uuid(), 'completed', 200,
			'{}'::bytea, now() - $2::interval, now() - $2::interval, now() - $2::interval
		FROM generate_series(1, $1) i`, n, age)
	if err != nil {
		return err
	}
	_, err = db.pool.Exec(ctx, `VACUUM ANALYZE onceflow_keys`)
	return err
}

// claimNew claims a new key per call.
func claimNew(store *recovery.Store, prefix string) op {
	return func(ctx context.Context, i int64) error {
		_, _, err := store.Claim(ctx, recovery.ClaimParams{
			Key: recovery.Key{Tenant: "bench", ID: fmt.Sprintf("%s%d", prefix, i)}, Workflow: "op",
			Fingerprint: recovery.FingerprintBytes("op", nil),
		})
		return err
	}
}

// tableSizeCase compares the claim's median latency on a table of ten
// thousand records and on one of cfg.LargeTable, in alternating chunks.
func tableSizeCase(ctx context.Context, srv *server, cfg Config) ([]Result, error) {
	var stores [2]*recovery.Store
	for i, n := range []int{10_000, cfg.LargeTable} {
		db, err := srv.newDatabase(ctx, 2)
		if err != nil {
			return nil, err
		}
		defer db.pool.Close()
		if err := seed(ctx, db, n, "1 hour"); err != nil {
			return nil, err
		}
		if stores[i], err = recovery.New(db.pool, recovery.Config{}); err != nil {
			return nil, err
		}
	}
	var (
		lat  [2][]time.Duration
		next atomic.Int64
	)
	for range 10 {
		for i, store := range stores {
			ds, err := latencies(ctx, 200, claimNew(store, "k"), &next)
			if err != nil {
				return nil, err
			}
			lat[i] = append(lat[i], ds...)
		}
	}
	small, large := ms(percentile(lat[0], 50)), ms(percentile(lat[1], 50))
	r := large / small
	return []Result{{Figure: fmt.Sprintf("claim p50, %d vs 10000 records", cfg.LargeTable), Onceflow: large, Floor: small,
		Unit: "ms", Ratio: r, Target: "≤ 1.3", Pass: r <= 1.3, Note: "floor column: the small table"}}, nil
}

// pruningCase measures the pruning rate, and the claim's p99 while pruning
// against idle.
func pruningCase(ctx context.Context, srv *server, cfg Config) ([]Result, error) {
	const rows = 100_000
	db, err := srv.newDatabase(ctx, 4)
	if err != nil {
		return nil, err
	}
	defer db.pool.Close()
	if err := seed(ctx, db, rows, "2 days"); err != nil {
		return nil, err
	}
	store, err := recovery.New(db.pool, recovery.Config{})
	if err != nil {
		return nil, err
	}
	var next atomic.Int64
	idle, err := latencies(ctx, 2000, claimNew(store, "idle-"), &next)
	if err != nil {
		return nil, err
	}
	pruner, err := sweeper.NewPruner(db.pool, sweeper.PrunerConfig{})
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	started := time.Now()
	var took time.Duration
	go func() { err := pruner.Run(ctx); took = time.Since(started); done <- err }()
	var during []time.Duration
	for pruning := true; pruning; {
		ds, err := latencies(ctx, 50, claimNew(store, "busy-"), &next)
		if err != nil {
			return nil, err
		}
		during = append(during, ds...)
		select {
		case err := <-done:
			if err != nil {
				return nil, err
			}
			pruning = false
		default:
		}
	}
	idleP99, busyP99 := ms(percentile(idle, 99)), ms(percentile(during, 99))
	r := busyP99 / idleP99
	return []Result{
		{Figure: "pruning rate", Onceflow: float64(rows) / took.Seconds(), Unit: "rows/s", Ratio: float64(rows) / took.Seconds(),
			Target: "reported", Pass: true, Note: "default batches of 1000 with pauses of about 100ms"},
		{Figure: "claim p99 while pruning vs idle", Onceflow: busyP99, Floor: idleP99, Unit: "ms", Ratio: r, Target: "≤ 2",
			Pass: r <= 2, Note: fmt.Sprintf("%d claims during pruning; floor column: idle", len(during))},
	}, nil
}
