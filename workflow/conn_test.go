package workflow_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// smallPool is a pool of n connections on w's database, all connected.
func smallPool(t *testing.T, url string, n int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	dbtest.CheckRouting(t, cfg.ConnConfig)
	cfg.MaxConns, cfg.MinConns = n, n
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	require.NoError(t, db.Ping(context.Background()))
	return db
}

// TestAttemptsLeaveAConnectionForRenewals: an engine's attempts hold at
// most all but one of a pool's connections, so that renewals and
// hand-backs never queue behind them; a pool of one connection is shared.
func TestAttemptsLeaveAConnectionForRenewals(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	for _, c := range []struct{ size, places int32 }{{3, 2}, {10, 9}, {1, 0}} {
		e, err := workflow.NewEngine(smallPool(t, url, c.size), workflow.Config{})
		require.NoError(t, err)
		n, release, err := workflow.HoldWorkPlaces(context.Background(), e)
		require.NoError(t, err)
		release()
		require.EqualValues(t, c.places, n, "a pool of %d", c.size)
	}
}

// TestLeaseKeptWhileWaitingForAConnection: an attempt whose next atomic
// phase waits for a connection longer than a lease (every connection
// attempts may take is taken: a busy pool, a queue of duplicates) keeps its
// lease by renewals while it waits, and finishes on its first attempt once
// a connection comes back. Real time is the point: the lease is 2s, and
// the wait lasts until four renewals (more than a lease) have succeeded.
//
// Before, no heartbeat ran while a phase waited for its connection, and
// renewals queued behind the attempts for the same pool: on a busy pool
// the lease ran out there, the phase started with its lease lost, and
// every retry did the same (TestConnectionLossUnderLoad beside CPU hogs).
func TestLeaseKeptWhileWaitingForAConnection(t *testing.T) {
	w := newWorld(t)
	const lease = 2 * time.Second
	db := smallPool(t, w.db.Config().ConnString(), 3)
	var (
		finishStarted  atomic.Bool
		renewedWaiting atomic.Int32
		called         = make(chan struct{})
	)
	wf := workflow.Define("waits_for_a_connection",
		foreign.Mutation("call", func(ctx context.Context, _ *foreign.Call[Order, Paid]) error {
			select {
			case <-called:
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}),
		phase.Atomic("finish", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error {
			finishStarted.Store(true)
			return nil
		}))
	e, err := workflow.NewEngine(db, workflow.Config{Lease: lease, Hooks: &workflow.Hooks{
		LeaseRenewed: func(_ workflow.Key, step string, _ time.Time, err error) {
			if step == "finish" && err == nil {
				renewedWaiting.Add(1)
			}
		}}})
	require.NoError(t, err)

	type outcome struct {
		res *workflow.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := wf.Run(w.ctx, e, acme, order)
		done <- outcome{res, err}
	}()
	// The claim is committed and the call under way: take every place an
	// attempt may hold, then let the call end, so that the next phase waits.
	require.Eventually(t, func() bool { return w.keys() == 1 }, 10*lease, 10*time.Millisecond)
	n, release, err := workflow.HoldWorkPlaces(w.ctx, e)
	require.NoError(t, err)
	released := false
	defer func() { // a failure below must not keep the pool from closing
		if !released {
			release()
		}
	}()
	require.Positive(t, n)
	close(called)

	require.Eventually(t, func() bool { return renewedWaiting.Load() >= 4 }, 10*lease, 10*time.Millisecond,
		"the lease is renewed while the phase waits for a connection")
	require.False(t, finishStarted.Load(), "the phase waited for its connection")
	release()
	released = true

	out := <-done
	require.NoError(t, out.err)
	require.Equal(t, recovery.OutcomeNew, out.res.Outcome, "finished by its first attempt")
	require.True(t, finishStarted.Load())
	require.Zero(t, w.count(`SELECT attempts FROM onceflow_keys WHERE tenant_id = $1 AND key = $2`, acme.Tenant, acme.ID))
}
