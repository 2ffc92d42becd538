package foreign_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
)

// A call whose slot cannot be renewed because its process's pool is busy
// (every connection taken by other work, so the renewal waits for one) is
// cancelled before its slot's lease ends, so that it has stopped when
// another process takes the slot. (Mutation caught: the renewal waiting on
// the pool with no deadline, and the loss checked only after it returns:
// the first call ran on beside the second.)
func TestPaceSlotRenewalStuckOnABusyPoolCancelsTheCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	limits := map[string]foreign.Pace{"payments": {Concurrency: 1}}
	holderPool := dbtest.Connect(t, url, 1)
	holder, err := foreign.NewPacer(holderPool, foreign.PacerConfig{Limits: limits})
	require.NoError(t, err)
	waiter, _ := pacer(t, url, limits)

	const lease = 2400 * time.Millisecond
	ctx, stop := context.WithCancel(ctx) // a failure must not leave the first call holding the pool
	t.Cleanup(stop)
	holderCalled := make(chan context.Context, 1)
	held := make(chan error, 1)
	go func() {
		held <- holder.Pace(ctx, "payments", "acme", lease, func(ctx context.Context) error {
			conn, err := holderPool.Acquire(ctx) // the process's other work takes its only connection
			if err != nil {
				return err
			}
			defer conn.Release()
			holderCalled <- ctx
			<-ctx.Done()
			return context.Cause(ctx)
		})
	}()
	var holderCtx context.Context
	select {
	case holderCtx = <-holderCalled:
	case err := <-held:
		t.Fatalf("the first call did not start: %v", err)
	}

	var stillRunning bool
	require.NoError(t, waiter.Pace(ctx, "payments", "acme", time.Minute, func(context.Context) error {
		stillRunning = holderCtx.Err() == nil
		return nil
	}))
	require.False(t, stillRunning, "the second call started while the first, whose slot it took, still ran")
	require.ErrorContains(t, <-held, "slot was lost")
}

// A Pace's Rate below one a day is refused: its next token would be further
// off than a deferral lasts, and, nearer zero, than a time.Duration holds
// (a wait that overflowed below zero was polled for ever) or the database's
// arithmetic allows. At one a day, the second call defers at once, for
// about a day. (Mutation caught: validate without PaceRateMin: the pacer is
// made, and the calls poll until their context ends or fail in the
// database.)
func TestPaceTinyRate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	pool := dbtest.Connect(t, url, 2)
	for _, rate := range []float64{1e-10, 1e-300, 5e-324, math.SmallestNonzeroFloat64, foreign.PaceRateMin / 2} {
		_, err := foreign.NewPacer(pool, foreign.PacerConfig{Limits: map[string]foreign.Pace{"slow": {Rate: rate}}})
		require.ErrorIs(t, err, foreign.ErrInvalidPace, "rate %g", rate)
	}
	p, _ := pacer(t, url, map[string]foreign.Pace{"slow": {Rate: foreign.PaceRateMin}})
	require.NoError(t, p.Pace(ctx, "slow", "", time.Minute, func(context.Context) error { return nil }), "the first token is there")
	bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	called := false
	err := p.Pace(bounded, "slow", "", time.Minute, func(context.Context) error { called = true; return nil })
	var wait *foreign.WaitError
	require.ErrorAs(t, err, &wait)
	require.InDelta(t, (24 * time.Hour).Seconds(), wait.Wait.Seconds(), time.Minute.Seconds())
	require.False(t, called)
}

// Two first calls to a downstream at once, the second refused a token (a
// slow Rate): the second's statement waits for the first's new bucket row,
// and, refused, reads the bucket in a snapshot taken before that row was
// committed. It defers like any refused call, instead of failing with "no
// rows". (Mutation caught: pgx.ErrNoRows returned as the call's error.)
func TestPaceFirstCallsAtOnceToASlowBucket(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	p, _ := pacer(t, url, map[string]foreign.Pace{"payments": {Rate: 0.01}})
	admin := dbtest.Connect(t, dbtest.DirectURL(t, url), 2)

	first, err := admin.Begin(ctx) // the first call's bucket, not yet committed
	require.NoError(t, err)
	defer func() { _ = first.Rollback(ctx) }()
	_, err = first.Exec(ctx, `INSERT INTO onceflow_pace (downstream, scope, tokens, refilled_at)
		VALUES ('payments', '', 0, clock_timestamp())`)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		done <- p.Pace(ctx, "payments", "acme", time.Minute, func(context.Context) error { return nil })
	}()
	require.Eventually(t, func() bool {
		var waiting int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%onceflow_pace%'`).Scan(&waiting)
		return err == nil && waiting == 1
	}, 10*time.Second, 5*time.Millisecond, "the second call waits for the first's row")
	require.NoError(t, first.Commit(ctx))
	var wait *foreign.WaitError
	require.ErrorAs(t, <-done, &wait)
	require.False(t, wait.Circuit)
}
