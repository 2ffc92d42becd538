package workflow_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// crashAt returns hooks that stop an attempt at point, as a process death
// would.
func crashAt(point workflow.CrashPoint) *workflow.Hooks {
	return &workflow.Hooks{CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
		if p == point {
			return errors.New("killed")
		}
		return nil
	}}
}

func TestTakeoverResumesFromRecoveryPoint(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	crashing := w.engine(workflow.Config{Hooks: crashAt(workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"})})

	_, err := crashing.Run(w.ctx, acme, wf, order)
	require.ErrorIs(t, err, workflow.ErrCrashed)
	rec, err := crashing.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.False(t, rec.Released, "a crash releases nothing")
	require.Equal(t, "create_order", rec.RecoveryPoint)

	e := w.engine(workflow.Config{})
	_, err = e.Run(w.ctx, acme, wf, order)
	require.ErrorIs(t, err, workflow.ErrInFlight, "the dead attempt's lease still holds")

	require.NoError(t, e.Store().ExpireLease(w.ctx, acme))
	res, err := e.Run(w.ctx, acme, wf, order)
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
	require.Equal(t, "create_order", res.ResumedFrom)
	require.Equal(t, 201, res.Response.Status)
	require.Equal(t, 1, w.orders())
	require.Equal(t, 1, w.provider.Effects())
	require.Len(t, w.provider.keys, 2, "the charge was sent twice…")
	require.Equal(t, w.provider.keys[0], w.provider.keys[1], "…with the same derived key")

	rec, err = e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, 1, rec.Attempts, "the crashed attempt is counted")
}

// TestResumeWithoutClient: the sweeper's path, from the stored request.
func TestResumeWithoutClient(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	crashing := w.engine(workflow.Config{Hooks: crashAt(workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"})})
	_, err := crashing.Run(w.ctx, acme, wf, order)
	require.ErrorIs(t, err, workflow.ErrCrashed)

	// Another process knows the workflow by name only.
	sweeper := w.engine(workflow.Config{Workflows: []workflow.Definition{wf}})
	_, err = sweeper.Resume(w.ctx, acme)
	require.ErrorIs(t, err, workflow.ErrInFlight)
	require.NoError(t, sweeper.Store().ExpireLease(w.ctx, acme))

	res, err := sweeper.Resume(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
	require.Equal(t, "create_order", res.ResumedFrom)
	require.JSONEq(t, `{"order_id":1,"charge_id":"ch_1","status":"paid"}`, string(res.Response.Body))

	client, err := w.engine(workflow.Config{}).Run(w.ctx, acme, wf, order)
	require.NoError(t, err)
	require.True(t, client.Replayed, "the client's retry gets the sweeper's response")
	require.Equal(t, res.Response, client.Response)
	again, err := sweeper.Resume(w.ctx, acme)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, 1, w.orders())
	require.Equal(t, 1, w.provider.Effects())
}

func TestResumeErrors(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	_, err := w.engine(workflow.Config{}).Resume(w.ctx, acme)
	require.ErrorIs(t, err, workflow.ErrNotFound)

	crashing := w.engine(workflow.Config{Hooks: crashAt(workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"})})
	_, err = crashing.Run(w.ctx, acme, wf, order)
	require.ErrorIs(t, err, workflow.ErrCrashed)
	require.NoError(t, crashing.Store().ExpireLease(w.ctx, acme))
	_, err = w.engine(workflow.Config{}).Resume(w.ctx, acme)
	require.ErrorIs(t, err, workflow.ErrUnknownWorkflow, "an engine that does not know the workflow leaves it alone")
	rec, err := crashing.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Zero(t, rec.Attempts, "and does not touch it")
}

// TestZombieIsFencedOut: an attempt stalls inside an atomic phase past its
// lease; another takes over and finishes; when the stalled one wakes and
// tries to commit, its transaction rolls back and the new owner's result
// stands.
func TestZombieIsFencedOut(t *testing.T) {
	w := newWorld(t)
	stalled, wake := make(chan struct{}), make(chan struct{})
	first := true
	w.before = func(ctx context.Context, step string) error {
		if step == "record_charge" && first {
			first = false
			close(stalled)
			<-wake
		}
		return nil
	}
	wf := w.checkout()
	zombie := w.engine(workflow.Config{})
	zombieDone := make(chan error, 1)
	go func() {
		_, err := zombie.Run(w.ctx, acme, wf, order)
		zombieDone <- err
	}()
	<-stalled

	e := w.engine(workflow.Config{})
	require.NoError(t, e.Store().ExpireLease(w.ctx, acme))
	res, err := e.Run(w.ctx, acme, wf, order)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)

	close(wake) // the zombie now inserts its ledger row and tries to commit
	err = <-zombieDone
	require.ErrorIs(t, err, workflow.ErrLeaseLost)
	require.Equal(t, 1, w.ledger(), "the zombie's write rolled back")
	require.Equal(t, 1, w.orders())
	stored, err := e.Run(w.ctx, acme, wf, order)
	require.NoError(t, err)
	require.Equal(t, res.Response, stored.Response, "the new owner's result stands")
}

// TestCommitBudget: N atomic phases commit N transactions; the claim and the
// completion fold into the first and last phases.
func TestCommitBudget(t *testing.T) {
	w := newWorld(t)
	noop := func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, entry) VALUES (0, $1)`, r.Step)
		return err
	}
	call := func() error { return nil }
	// roundTrips is what the same statements take without onceflow: BEGIN,
	// the phase's statement and COMMIT per atomic phase.
	cases := []struct {
		wf                  *workflow.Workflow[Order, Paid]
		commits, roundTrips int64
	}{
		{workflow.Define("a", atomicStep("a1", noop)), 1, 3},
		{workflow.Define("afa", atomicStep("a1", noop), foreignStep("f1", call), atomicStep("a2", noop)), 2, 6},
		{workflow.Define("afafa", atomicStep("a1", noop), foreignStep("f1", call), atomicStep("a2", noop),
			foreignStep("f2", call), atomicStep("a3", noop)), 3, 9},
		// Without an atomic phase to fold into, a foreign step's result is
		// committed on its own, and so is the claim before a first foreign step.
		{workflow.Define("ffa", foreignStep("f1", call), foreignStep("f2", call), atomicStep("a1", noop)), 3, 3},
		{workflow.Define("af", atomicStep("a1", noop), foreignStep("f1", call)), 2, 3},
	}
	e := w.engine(workflow.Config{})
	for i, tc := range cases {
		key := workflow.Key{Tenant: "acme", ID: tc.wf.Name()}
		before := w.counter.Counts()
		res, err := e.Run(w.ctx, key, tc.wf, order)
		require.NoError(t, err)
		require.Equal(t, 200, res.Response.Status)
		got := w.counter.Counts().Sub(before)
		require.Equal(t, tc.commits, got.Commits, "case %d (%s): %+v", i, tc.wf.Name(), got)
		require.LessOrEqual(t, got.RoundTrips(), tc.roundTrips+2, "case %d (%s): %+v", i, tc.wf.Name(), got)

		before = w.counter.Counts()
		res, err = e.Run(w.ctx, key, tc.wf, order)
		require.NoError(t, err)
		require.True(t, res.Replayed)
		got = w.counter.Counts().Sub(before)
		require.LessOrEqual(t, got.RoundTrips(), int64(3), "a replay is a claim and at most a begin and a rollback")
		require.LessOrEqual(t, got.Commits, int64(1), "a replay writes nothing")
	}
}

// TestHeartbeatRenewsLongSteps: a step that outlives a third of its lease
// twice has its lease renewed twice, each renewal moving it. The lease is
// long enough that renewals a third of it apart come in time on a loaded
// machine; the test lasts about two thirds of it.
func TestHeartbeatRenewsLongSteps(t *testing.T) {
	w := newWorld(t)
	renewed := make(chan time.Time, 16)
	hooks := &workflow.Hooks{LeaseRenewed: func(_ workflow.Key, step string, until time.Time, err error) {
		if err == nil && step == "slow" {
			renewed <- until
		}
	}}
	wf := workflow.Define("slow",
		foreign.Mutation("slow", func(ctx context.Context, c *foreign.Call[Order, Paid]) error {
			var seen []time.Time
			for len(seen) < 2 { // the step outlives a third of its lease twice
				select {
				case until := <-renewed:
					seen = append(seen, until)
				case <-time.After(30 * time.Second):
					return errors.New("no renewal came")
				}
			}
			if !seen[1].After(seen[0]) {
				return errors.New("the lease did not move")
			}
			return nil
		}),
	)
	e := w.engine(workflow.Config{Lease: 2 * time.Second, Hooks: hooks})
	res, err := e.Run(w.ctx, acme, wf, order)
	require.NoError(t, err)
	require.Equal(t, 200, res.Response.Status)
}

// TestHeartbeatLosingLeaseCancelsStep: when a renewal finds the key taken
// over, the step's context is cancelled and the attempt stops. The lease
// is long enough that the heartbeat's own deadline (a whole lease without
// a renewal) cannot come first on a loaded machine.
func TestHeartbeatLosingLeaseCancelsStep(t *testing.T) {
	w := newWorld(t)
	const lease = 2 * time.Second
	entered := make(chan struct{})
	lost := make(chan error, 16)
	hooks := &workflow.Hooks{LeaseRenewed: func(_ workflow.Key, _ string, _ time.Time, err error) {
		if err != nil {
			lost <- err
		}
	}}
	wf := workflow.Define("long",
		foreign.Mutation("long", func(ctx context.Context, c *foreign.Call[Order, Paid]) error {
			close(entered)
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(30 * lease):
				return errors.New("the step was never cancelled")
			}
		}),
	)
	e := w.engine(workflow.Config{Lease: lease, Hooks: hooks})
	done := make(chan error, 1)
	go func() {
		_, err := e.Run(w.ctx, acme, wf, order)
		done <- err
	}()
	<-entered
	// Another process takes the key over.
	require.NoError(t, e.Store().ExpireLease(w.ctx, acme))
	_, _, err := e.Store().Takeover(w.ctx, acme)
	require.NoError(t, err)

	err = <-done // the hooks have all run once Run returns
	require.ErrorIs(t, err, workflow.ErrLeaseLost)
	select {
	case renewal := <-lost:
		require.ErrorIs(t, renewal, recovery.ErrLeaseLost, "a renewal found the key taken over")
		require.Empty(t, lost, "the heartbeat stopped at the first renewal that found the key taken over")
	default:
		require.Fail(t, "no renewal found the key taken over")
	}
	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.False(t, rec.Released, "a lost lease is not released: it is someone else's")
}

// TestCancelledCallerReleases: a caller that gives up stops the attempt; the
// lease is handed back so a retry resumes at once.
func TestCancelledCallerReleases(t *testing.T) {
	w := newWorld(t)
	entered := make(chan struct{})
	w.before = func(ctx context.Context, step string) error {
		if step == "charge" {
			close(entered)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}
	wf := w.checkout()
	e := w.engine(workflow.Config{})
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() {
		_, err := e.Run(ctx, acme, wf, order)
		done <- err
	}()
	<-entered
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.True(t, rec.Released)
	require.Equal(t, "create_order", rec.RecoveryPoint)

	w.before = nil
	res, err := e.Run(w.ctx, acme, wf, order)
	require.NoError(t, err)
	require.Equal(t, "create_order", res.ResumedFrom)
	require.Equal(t, 1, w.orders())
}
