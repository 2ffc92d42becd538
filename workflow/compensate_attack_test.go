package workflow_test

// Attacks on compensation: ways a saga could keep money it should have
// refunded, or refund twice, against a real PostgreSQL and a provider over
// real HTTP.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// TestARefusalOfAStepAnEarlierAttemptStartedIsUndone: the charge reached
// the provider, and the process died before committing it. The next
// attempt sends the charge again with the same key, and the provider
// refuses that call for good (409: the key is in use by a request it is
// still processing, as a payment provider answers a concurrent duplicate).
// The refusal says nothing of the first call, whose charge stands: it must
// be refunded, not skipped as a step that "did nothing".
func TestARefusalOfAStepAnEarlierAttemptStartedIsUndone(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	crash := w.engine(workflow.Config{Hooks: &workflow.Hooks{CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
		if p == (workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"}) {
			return errors.New("killed")
		}
		return nil
	}}})
	_, err := s.workflow().Run(w.ctx, crash, acme, order)
	require.ErrorIs(t, err, workflow.ErrCrashed)
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.NoError(t, crash.Store().ExpireLease(w.ctx, acme))

	w.provider.Fail("charges", testapp.Fault{Status: http.StatusConflict})
	res, err := s.workflow().Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.NoError(t, err)
	require.True(t, res.Compensated)
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.Equal(t, 1, w.provider.Effects("refunds"), "the charge the first attempt made is refunded")
	require.Equal(t, 1, w.provider.Effects("releases"))
}

// TestARefusalAfterATryThatMayHaveChargedIsUndone: within one attempt, the
// first try of the charge reaches the provider but its answer is lost (the
// try times out); the retry, with the same key, is refused for good. The
// first try's charge stands and must be refunded.
func TestARefusalAfterATryThatMayHaveChargedIsUndone(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	const try = 200 * time.Millisecond
	wf := workflow.Define("retried_saga",
		foreign.Mutation("charge", s.call("charges"), s.undo("refunds"),
			foreign.Retry{Max: 2, Base: time.Millisecond}, foreign.Timeout(try)),
		atomicStep("record", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil }),
	)
	w.provider.Fail("charges", testapp.Fault{Hang: true}, testapp.Fault{Status: http.StatusConflict})

	res, err := wf.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.NoError(t, err)
	require.True(t, res.Compensated, "failed %v", res.Failed)
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.Equal(t, 1, w.provider.Effects("refunds"), "the charge the lost try made is refunded")
	require.Equal(t, recovery.StatusCompensated, w.record(acme).Status)
}

// TestAnAbortAfterATakeoverUndoesTheEarlierAttemptsCall: the charge
// reached the provider and the process died before committing it. The
// retry takes the record over and the same step now decides not to charge
// (an offer closed, a fraud check) and aborts before calling. The decision
// says nothing of the first attempt's charge, which stands: it is refunded,
// and the Abort's answer is the key's.
func TestAnAbortAfterATakeoverUndoesTheEarlierAttemptsCall(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	s.fail["charge"] = func(attempt int) error {
		if attempt > 1 {
			return workflow.Abort(workflow.Problem(http.StatusConflict, "the offer closed"))
		}
		return nil
	}
	crash := w.engine(workflow.Config{Hooks: &workflow.Hooks{CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
		if p == (workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"}) {
			return errors.New("killed")
		}
		return nil
	}}})
	_, err := s.workflow().Run(w.ctx, crash, acme, order)
	require.ErrorIs(t, err, workflow.ErrCrashed)
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.NoError(t, crash.Store().ExpireLease(w.ctx, acme))

	res, err := s.workflow().Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.NoError(t, err)
	require.True(t, res.Compensated, "failed %v", res.Failed)
	require.Equal(t, http.StatusConflict, res.Response.Status)
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.Equal(t, 1, w.provider.Effects("refunds"), "the charge the first attempt made is refunded")
	require.Equal(t, 1, w.provider.Effects("releases"))
	require.Equal(t, recovery.StatusCompensated, w.record(acme).Status)
}

// TestAnAbortAfterATryThatMayHaveChargedIsUndone: within one attempt, the
// first try of the charge reaches the provider but its answer is lost (the
// try times out); before the next try the step decides to abort. The first
// try's charge stands and must be refunded.
func TestAnAbortAfterATryThatMayHaveChargedIsUndone(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	const try = 200 * time.Millisecond
	var tries atomic.Int32
	charge := s.call("charges")
	wf := workflow.Define("aborted_saga",
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[Order, Paid]) error {
			if tries.Add(1) > 1 {
				return workflow.Abort(workflow.Problem(http.StatusConflict, "the offer closed"))
			}
			return charge(ctx, c)
		}, s.undo("refunds"), foreign.Retry{Max: 2, Base: time.Millisecond}, foreign.Timeout(try)),
		atomicStep("record", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil }),
	)
	w.provider.Fail("charges", testapp.Fault{Hang: true})

	res, err := wf.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.NoError(t, err)
	require.True(t, res.Compensated, "failed %v", res.Failed)
	require.Equal(t, int32(2), tries.Load())
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.Equal(t, 1, w.provider.Effects("refunds"), "the charge the lost try made is refunded")
	require.Equal(t, recovery.StatusCompensated, w.record(acme).Status)
}

// unreadableOrder is a request type the saga's stored requests do not
// decode into: a release whose request changed shape, resuming records an
// earlier one wrote.
type unreadableOrder struct {
	Customer int `json:"customer"`
}

// panickyOrder is a request type whose decoding panics (a bug in its
// UnmarshalJSON): an attempt fails before it reads the record, as any
// failure would, and the next may read it.
type panickyOrder struct{}

func (*panickyOrder) UnmarshalJSON([]byte) error { panic("a request decoder with a bug") }

// sagaAs is the saga under request type Req, which its records may not be
// read as; its compensations note that they ran.
func sagaAs[Req any](s *saga) *workflow.Workflow[Req, Paid] {
	undo := func(what string) foreign.Option {
		return foreign.Compensate(func(context.Context, *foreign.Call[Req, Paid]) error {
			s.log(what + " with an unread request")
			return nil
		})
	}
	do := func(context.Context, *foreign.Call[Req, Paid]) error { return nil }
	return workflow.Define("saga",
		foreign.Mutation("reserve", do, undo("releases")),
		foreign.Mutation("charge", do, undo("refunds")),
		phase.Atomic("record", func(context.Context, pgx.Tx, *phase.Run[Req, Paid]) error { return nil }),
		foreign.Mutation("ship", do),
	)
}

// TestACompensatingRecordItsAttemptsCannotReadEndsFailed: a record is
// compensating, and each attempt that resumes it fails before reaching
// the compensations (its request's decoder panics). After MaxAttempts the
// record must end failed, with what is left to undo listed and the failure
// answer kept, not be taken over again for ever. (A request that does not
// decode parks the record instead: TestARequestItsDefinitionCannotReadParks.)
func TestACompensatingRecordItsAttemptsCannotReadEndsFailed(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	s.fail["record"] = func(int) error { return phase.Permanent(errors.New("refused")) }
	w.provider.Fail("refunds", testapp.Fault{Status: http.StatusServiceUnavailable})
	_, err := s.workflow().Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.Error(t, err)
	require.True(t, w.record(acme).Compensating())

	e := w.engine(workflow.Config{MaxAttempts: 3, Workflows: []workflow.Definition{sagaAs[panickyOrder](s)}})
	var res *workflow.Result
	for range 4 {
		rec := w.record(acme)
		if rec.Finished() {
			break
		}
		require.NoError(t, e.Store().ExpireLease(w.ctx, acme))
		res, err = e.Resume(w.ctx, acme)
	}
	require.NoError(t, err)
	require.True(t, res.Failed)
	rec := w.record(acme)
	require.Equal(t, recovery.StatusFailed, rec.Status, "attempts %d, last error %s", rec.Attempts, rec.LastError)
	require.Equal(t, []string{"charge", "reserve"}, rec.Undo)
	require.Equal(t, 500, rec.Response.Status)
	require.Zero(t, w.provider.Effects("refunds"))
	require.NotContains(t, s.logged(), "refunds with an unread request")
}

// TestAnAttemptThatCannotReadTheRecordNeitherWipesItsStateNorUndoesBlind:
// the last attempt MaxAttempts allows fails reading the record's request
// (its decoder panics). The workflow fails for good before its point of no
// return, so its charge is to be undone; but the state the steps committed
// (the charge's id) must stay, and the compensations must not run with a
// request and a state this attempt never read.
func TestAnAttemptThatCannotReadTheRecordNeitherWipesItsStateNorUndoesBlind(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	crash := w.engine(workflow.Config{Hooks: &workflow.Hooks{CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
		if p == (workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "reserve"}) {
			return errors.New("killed")
		}
		return nil
	}}})
	_, err := s.workflow().Run(w.ctx, crash, acme, order)
	require.ErrorIs(t, err, workflow.ErrCrashed)
	_, err = w.db.Exec(w.ctx, `UPDATE onceflow_keys SET state = '{"order_id": 7, "charge_id": "ch_kept"}'`)
	require.NoError(t, err)
	before := w.record(acme)
	require.NoError(t, crash.Store().ExpireLease(w.ctx, acme))

	e := w.engine(workflow.Config{MaxAttempts: 1, Workflows: []workflow.Definition{sagaAs[panickyOrder](s)}})
	_, err = e.Resume(w.ctx, acme)
	var panicked *phase.PanicError
	require.ErrorAs(t, err, &panicked)
	rec := w.record(acme)
	require.JSONEq(t, string(before.State), string(rec.State), "status %s, undo %v", rec.Status, rec.Undo)
	require.True(t, rec.Compensating())
	require.True(t, rec.Released, "handed back for an attempt that can read it")
	for _, call := range s.logged() {
		require.NotContains(t, call, "unread request")
	}

	res, err := w.engine(workflow.Config{Workflows: []workflow.Definition{s.workflow()}}).Resume(w.ctx, acme)
	require.NoError(t, err)
	require.True(t, res.Compensated)
	require.Equal(t, 1, w.provider.Effects("refunds"))
	require.Equal(t, 1, w.provider.Effects("releases"))
	require.JSONEq(t, string(before.State), string(w.record(acme).State))
}

// TestDefineRejectsMoreCompensationsThanAnUndoListHolds: a record lists at
// most recovery.MaxUndo steps to undo. A workflow with more compensable
// steps could fail with more started, and never start compensating: every
// attempt's giveUp would be refused, and the key retried for ever. Define
// refuses it, as it refuses any broken definition.
func TestDefineRejectsMoreCompensationsThanAnUndoListHolds(t *testing.T) {
	t.Parallel()
	undo := foreign.Compensate(func(context.Context, *foreign.Call[Order, Paid]) error { return nil })
	do := func(context.Context, *foreign.Call[Order, Paid]) error { return nil }
	steps := func(n int) []phase.Step[Order, Paid] {
		var steps []phase.Step[Order, Paid]
		for i := range n {
			steps = append(steps, foreign.Mutation(fmt.Sprintf("s%d", i), do, undo))
		}
		return steps
	}
	require.NotPanics(t, func() { workflow.Define("most", steps(recovery.MaxUndo)...) })
	require.Panics(t, func() { workflow.Define("too_many", steps(recovery.MaxUndo+1)...) })
}

// sagaRenamed is the saga whose charge step was called pay before: it
// derives the charge's keys from "pay" when rename is set, from "charge"
// once the rename's declaration is dropped.
func (s *saga) renamed(rename bool) *workflow.Workflow[Order, Paid] {
	wf := workflow.Define("saga",
		foreign.Mutation("reserve", s.call("reservations"), s.undo("releases")),
		foreign.Mutation("charge", s.call("charges"), s.undo("refunds")),
		atomicStep("record", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil }),
		foreign.Mutation("ship", s.call("shipments")),
	)
	if rename {
		wf.Changes(workflow.Renamed("pay", "charge"))
	}
	return wf
}

// TestAnUpgradeThatChangesACompletedStepsKeysDoesNotUndoAnotherCall: the
// charge, declared renamed from pay, was made with a key derived from
// "pay", and committed; then the workflow failed for good, and its refund
// is still to run. A release that dropped the rename's declaration derives
// the charge's keys from "charge": resuming the record, it would refund a
// charge that was never made (the provider has nothing under that key), and
// the one that was made stays charged. Forward, a completed step's keys no
// longer matter; a compensation still needs them: the record must be
// parked, not undone with other keys.
func TestAnUpgradeThatChangesACompletedStepsKeysDoesNotUndoAnotherCall(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	s.fail["ship"] = func(int) error { return phase.Permanent(errors.New("no carrier")) }
	w.provider.Fail("refunds", testapp.Fault{Status: http.StatusServiceUnavailable})
	_, err := s.renamed(true).Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.Error(t, err)
	require.True(t, w.record(acme).Compensating())
	charged := w.provider.Keys("charges")
	require.Len(t, charged, 1)

	_, err = s.renamed(false).Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	for _, call := range s.logged() {
		if strings.HasPrefix(call, "refunds ") {
			require.True(t, strings.HasSuffix(call, " of "+charged[0]), "a refund of another key than the charge's: %s", call)
		}
	}
	require.ErrorIs(t, err, workflow.ErrParked)
	require.Equal(t, recovery.StatusParked, w.record(acme).Status)
}

// TestCompensationAfterAFoldedTakeoverRolledBackKeepsTheNewClaimsLease: a
// Resume takes the record over in the transaction of the atomic phase after
// its recovery point, and that phase fails for good: the takeover rolls
// back with it, the key is claimed again under another owner token, and
// the attempt compensates under that claim. The refund outlives a third of
// the lease: the heartbeat renews the new claim's lease (not the rolled
// back one's), and the refund completes once.
func TestCompensationAfterAFoldedTakeoverRolledBackKeepsTheNewClaimsLease(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	const lease = time.Second
	renewed := make(chan error, 16)
	wf := workflow.Define("folded",
		foreign.Mutation("charge", s.call("charges"), foreign.Compensate(func(ctx context.Context, c *foreign.Call[Order, Paid]) error {
			select {
			case err := <-renewed:
				if err != nil {
					return err
				}
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			_, err := testapp.Call(ctx, w.provider.URL, "refunds", c.Key)
			return err
		})),
		atomicStep("record", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil }),
		atomicStep("confirm", func(_ context.Context, _ pgx.Tx, r *phase.Run[Order, Paid]) error {
			if r.Attempt == 1 {
				return errors.New("lock timeout")
			}
			return phase.Permanent(errors.New("the order cannot be confirmed"))
		}),
		foreign.Mutation("ship", s.call("shipments")),
	)
	_, err := wf.Run(w.ctx, w.engine(workflow.Config{Lease: lease}), acme, order)
	require.Error(t, err)
	rec := w.record(acme)
	require.Equal(t, "record", rec.RecoveryPoint)
	require.True(t, rec.Released)

	e := w.engine(workflow.Config{Lease: lease, Workflows: []workflow.Definition{wf},
		Hooks: &workflow.Hooks{LeaseRenewed: func(_ workflow.Key, step string, _ time.Time, err error) {
			if step == "charge" {
				renewed <- err
			}
		}}})
	res, err := e.Resume(w.ctx, acme)
	require.NoError(t, err)
	require.True(t, res.Compensated)
	require.Equal(t, 1, w.provider.Effects("refunds"))
	require.Equal(t, recovery.StatusCompensated, w.record(acme).Status)
}

// onMessage is a slog handler that runs fn, once, at the first record
// with message msg: a hook at the point an attempt logs it.
type onMessage struct {
	msg  string
	once sync.Once
	fn   func()
}

func (h *onMessage) Enabled(context.Context, slog.Level) bool { return true }
func (h *onMessage) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(h.fn)
	}
	return nil
}
func (h *onMessage) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *onMessage) WithGroup(string) slog.Handler      { return h }

// TestAFailureOvertakenWhileItsClaimWasRolledBackDoesNotGiveUp: a Resume
// folded into confirm's transaction fails there for the last time
// MaxAttempts allows. Its takeover rolls back with the phase, and before it
// claims the key again to record the failure, another process takes the
// record over, gets past confirm, ships, and fails later, handing the key
// back. The first attempt's failure is stale: the record moved on. Giving up
// on it would undo from where that attempt stood, the charge only, and
// leave the shipment it never saw standing; it must hand the key back.
func TestAFailureOvertakenWhileItsClaimWasRolledBackDoesNotGiveUp(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	var confirms atomic.Int32
	wf := workflow.Define("overtaken",
		foreign.Mutation("charge", s.call("charges"), s.undo("refunds")),
		atomicStep("record", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil }),
		atomicStep("confirm", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error {
			if confirms.Add(1) <= 3 {
				return errors.New("lock timeout")
			}
			return nil
		}),
		foreign.Mutation("ship", s.call("shipments"), s.undo("cancellations")),
		atomicStep("done", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error {
			return errors.New("lock timeout")
		}),
	)
	cfg := workflow.Config{MaxAttempts: 4, Workflows: []workflow.Definition{wf}}
	e := w.engine(cfg)
	for range 2 {
		_, err := wf.Run(w.ctx, e, acme, order)
		require.Error(t, err)
	}
	require.Equal(t, 2, w.record(acme).Attempts)

	// The third attempt at confirm (the one MaxAttempts 4 lets be the
	// last after the other's) is overtaken between its rollback and its
	// reclaim.
	other := w.engine(cfg)
	var overtook error
	cfg.Logger = slog.New(&onMessage{msg: "workflow step failed", fn: func() {
		_, overtook = other.Resume(w.ctx, acme)
	}})
	cfg.MaxAttempts = 3
	res, err := w.engine(cfg).Resume(w.ctx, acme)
	require.ErrorContains(t, overtook, "done")
	require.Equal(t, 1, w.provider.Effects("shipments"), "the other process shipped")

	rec := w.record(acme)
	if rec.Compensating() || rec.Status == recovery.StatusCompensated {
		require.Contains(t, rec.Undo, "ship", "undoing from a stale position skips the shipment")
	}
	require.Zero(t, w.provider.Effects("refunds"), "the stale failure undid the charge, the shipment standing")
	require.Error(t, err, "result %+v", res)
	require.Equal(t, recovery.StatusInFlight, rec.Status)
	require.Equal(t, "confirm", rec.RecoveryPoint, "where the other attempt left it")
	require.True(t, rec.Released, "handed back")
}
