package workflow_test

// Compensation (sagas), against a real PostgreSQL and a provider over real
// HTTP: a workflow that fails for good before its point of no return
// undoes its started foreign steps, each compensation exactly once at the
// provider, with a key of its own, durably across crashes.

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// saga is reserve (foreign, undone by release) → charge (foreign, undone by
// refund) → record (atomic) → ship (foreign, no undo). Each step first asks
// its knob in fail, by step name; calls lists every call made, provider
// side effects are counted by the provider.
type saga struct {
	w     *world
	fail  map[string]func(attempt int) error
	mu    sync.Mutex
	calls []string // "reserve", "refund <key> of <key>", ...
	wf    *workflow.Workflow[Order, Paid]
}

func newSaga(w *world) *saga {
	s := &saga{w: w, fail: map[string]func(int) error{}}
	s.wf = s.define()
	return s
}

// workflow is the saga's definition, declared once (an engine refuses two
// declarations of one version).
func (s *saga) workflow() *workflow.Workflow[Order, Paid] { return s.wf }

func (s *saga) knob(step string, attempt int) error {
	if f := s.fail[step]; f != nil {
		return f(attempt)
	}
	return nil
}

func (s *saga) log(call string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, call)
}

func (s *saga) logged() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

// call is a foreign step's function posting to endpoint with c.Key, after
// the step's knob.
func (s *saga) call(endpoint string) func(ctx context.Context, c *foreign.Call[Order, Paid]) error {
	return func(ctx context.Context, c *foreign.Call[Order, Paid]) error {
		if err := s.knob(c.Step, c.Attempt); err != nil {
			return err
		}
		s.log(endpoint + " " + c.Key)
		_, err := testapp.Call(ctx, s.w.provider.URL, endpoint, c.Key)
		return err
	}
}

// undo is a compensation posting to endpoint with its own key, after the
// knob named endpoint.
func (s *saga) undo(endpoint string) foreign.Option {
	return foreign.Compensate(func(ctx context.Context, c *foreign.Call[Order, Paid]) error {
		if err := s.knob(endpoint, c.Attempt); err != nil {
			return err
		}
		s.log(endpoint + " " + c.Key + " of " + c.Compensates)
		_, err := testapp.Call(ctx, s.w.provider.URL, endpoint, c.Key)
		return err
	})
}

func (s *saga) define() *workflow.Workflow[Order, Paid] {
	return workflow.Define("saga",
		foreign.Mutation("reserve", s.call("reservations"), s.undo("releases")),
		foreign.Mutation("charge", s.call("charges"), s.undo("refunds")),
		atomicStep("record", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			if err := s.knob("record", r.Attempt); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO orders (tenant, key, customer, amount, status) VALUES ($1, $2, $3, $4, 'recorded')`,
				r.Key.Tenant, r.Key.ID, r.Request.Customer, r.Request.Amount)
			return err
		}),
		foreign.Mutation("ship", s.call("shipments")),
	)
}

// keyOf is the downstream key step of the record of acme derives, with
// parts.
func (w *world) keyOf(step string, parts ...string) string {
	w.t.Helper()
	return foreign.DeriveKey(acme, w.record(acme).ID, step, parts...)
}

// TestCompensationUndoesStartedStepsLatestFirst: the local phase after two
// foreign steps fails permanently. Both are undone, the charge first, each
// with its own derived key naming the key it undoes; the record ends
// compensated with a stored 500 that every retry replays, and the phase's
// writes are not there.
func TestCompensationUndoesStartedStepsLatestFirst(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	s.fail["record"] = func(int) error { return phase.Permanent(errors.New("the order table refuses the row")) }
	e := w.engine(workflow.Config{})

	res, err := s.workflow().Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, res.Compensated)
	require.False(t, res.Failed)
	require.Equal(t, 500, res.Response.Status)
	require.Contains(t, string(res.Response.Body), "was undone")

	charge, reserve := w.keyOf("charge"), w.keyOf("reserve")
	require.Equal(t, []string{
		"reservations " + reserve,
		"charges " + charge,
		"refunds " + w.keyOf("charge", "compensate") + " of " + charge,
		"releases " + w.keyOf("reserve", "compensate") + " of " + reserve,
	}, s.logged())
	require.Equal(t, 1, w.provider.Effects("refunds"))
	require.Equal(t, 1, w.provider.Effects("releases"))
	require.Zero(t, w.provider.Effects("shipments"))
	require.Zero(t, w.orders())

	rec := w.record(acme)
	require.Equal(t, recovery.StatusCompensated, rec.Status)
	require.Empty(t, rec.Undo)
	require.True(t, rec.Finished())

	again, err := s.workflow().Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.True(t, again.Compensated)
	require.Equal(t, res.Response.Body, again.Response.Body)
	require.Len(t, s.logged(), 4, "a replay calls nothing")
}

// TestAbortFromAnAtomicPhaseCommitsItsWritesAndUndoes: a phase that finds
// the charge does not fit marks the order and aborts with its own answer.
// Its write commits with the decision, the charge is refunded once, and
// the Abort's response is the key's.
func TestAbortFromAnAtomicPhaseCommitsItsWritesAndUndoes(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	wf := workflow.Define("abort",
		foreign.Mutation("charge", s.call("charges"), s.undo("refunds")),
		atomicStep("record", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders (tenant, key, customer, amount, status) VALUES ($1, $2, $3, $4, 'cancelled')`,
				r.Key.Tenant, r.Key.ID, r.Request.Customer, r.Request.Amount); err != nil {
				return err
			}
			return workflow.Abort(workflow.Problem(http.StatusBadGateway, "the charge does not match the order; it was refunded"))
		}),
	)
	e := w.engine(workflow.Config{})

	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, res.Compensated)
	require.Equal(t, http.StatusBadGateway, res.Response.Status)
	require.Equal(t, 1, w.count(`SELECT count(*) FROM orders WHERE status = 'cancelled'`))
	require.Equal(t, 1, w.provider.Effects("refunds"))
	require.Equal(t, recovery.StatusCompensated, w.record(acme).Status)
}

// TestAbortWithNothingToUndoFails: an Abort before any foreign step ran
// has nothing to undo; the record ends failed with the Abort's answer.
func TestAbortWithNothingToUndoFails(t *testing.T) {
	w := newWorld(t)
	wf := workflow.Define("abort_first",
		atomicStep("check", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error {
			return workflow.Abort(workflow.Problem(409, "out of stock"))
		}),
		foreignStep("charge", func() error { return nil }),
	)
	res, err := wf.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.NoError(t, err)
	require.True(t, res.Failed)
	require.False(t, res.Compensated)
	require.Equal(t, 409, res.Response.Status)
	require.Equal(t, recovery.StatusFailed, w.record(acme).Status)
}

// TestCompensationAfterMaxAttempts: the phase after the charge fails
// transiently every time. The attempt that spends MaxAttempts undoes the
// charge; the charge was made once, under one key, over all attempts.
func TestCompensationAfterMaxAttempts(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	s.fail["record"] = func(int) error { return errors.New("lock timeout") }
	e := w.engine(workflow.Config{MaxAttempts: 2})
	wf := s.workflow()

	_, err := wf.Run(w.ctx, e, acme, order)
	require.Error(t, err)
	require.Zero(t, w.provider.Effects("refunds"))

	// The compensations get MaxAttempts attempts of their own: a refund
	// failing once does not fail the record.
	w.provider.Fail("refunds", testapp.Fault{Status: 503})
	_, err = wf.Run(w.ctx, e, acme, order)
	require.Error(t, err)
	require.True(t, w.record(acme).Compensating())

	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, res.Compensated)
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.Equal(t, 1, w.provider.Effects("refunds"))
	require.Equal(t, 1, w.provider.Effects("releases"))
}

// TestNoCompensationAfterThePointOfNoReturn: once record committed, a
// permanent failure of ship undoes nothing: the record fails, for an
// operator, and nothing is refunded.
func TestNoCompensationAfterThePointOfNoReturn(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	s.fail["ship"] = func(int) error { return phase.Permanent(errors.New("no carrier serves the address")) }
	e := w.engine(workflow.Config{})

	res, err := s.workflow().PointOfNoReturn("record").Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, res.Failed)
	require.False(t, res.Compensated)
	require.Equal(t, 500, res.Response.Status)
	require.Zero(t, w.provider.Effects("refunds"))
	require.Zero(t, w.provider.Effects("releases"))
	require.Equal(t, recovery.StatusFailed, w.record(acme).Status)
	require.Equal(t, 1, w.orders())
}

// TestAStepThatRefusedIsNotUndone: the charge fails permanently (the card
// is declined): its own call did nothing, so only the reservation is
// released.
func TestAStepThatRefusedIsNotUndone(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	s.fail["charge"] = func(int) error { return phase.Permanent(errors.New("card declined")) }

	res, err := s.workflow().Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.NoError(t, err)
	require.True(t, res.Compensated)
	require.Zero(t, w.provider.Effects("refunds"))
	require.Equal(t, 1, w.provider.Effects("releases"))
}

// TestCompensationSurvivesCrashes: a process dies at each point of the
// compensation path; a Resume after the lease ran out finishes it. Each
// compensation reaches the provider as one effect, however often it was
// called.
func TestCompensationSurvivesCrashes(t *testing.T) {
	t.Parallel()
	s0 := newSaga(nil)
	for _, p := range workflow.CompensationPoints(s0.workflow()) {
		t.Run(p.String(), func(t *testing.T) {
			w := newWorld(t)
			s := newSaga(w)
			s.fail["record"] = func(int) error { return phase.Permanent(errors.New("refused")) }
			crash := w.engine(workflow.Config{Hooks: &workflow.Hooks{CrashPoint: func(_ context.Context, _ workflow.Key, at workflow.CrashPoint) error {
				if at == p {
					return errors.New("killed")
				}
				return nil
			}}})
			_, err := s.workflow().Run(w.ctx, crash, acme, order)
			require.ErrorIs(t, err, workflow.ErrCrashed)
			rec := w.record(acme)
			require.True(t, rec.Compensating() || rec.Status == recovery.StatusCompensated, "status %s, undo %v", rec.Status, rec.Undo)
			if !rec.Compensating() {
				return // the crash came after the last commit
			}
			require.NoError(t, crash.Store().ExpireLease(w.ctx, acme))

			res, err := w.engine(workflow.Config{Workflows: []workflow.Definition{s.workflow()}}).Resume(w.ctx, acme)
			require.NoError(t, err)
			require.True(t, res.Compensated)
			require.Equal(t, 1, w.provider.Effects("refunds"))
			require.Equal(t, 1, w.provider.Effects("releases"))
			require.Equal(t, 1, w.provider.MaxCalls("charges"))
			require.Equal(t, recovery.StatusCompensated, w.record(acme).Status)
		})
	}
}

// TestCompensationRetriedByTheNextAttempt: the refund fails transiently;
// the key stays compensating, a client's retry takes it over and finishes
// the refund with the same key, and the answer is the stored failure.
func TestCompensationRetriedByTheNextAttempt(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	s.fail["record"] = func(int) error { return phase.Permanent(errors.New("refused")) }
	w.provider.Fail("refunds", testapp.Fault{Status: 503})
	e := w.engine(workflow.Config{})

	_, err := s.workflow().Run(w.ctx, e, acme, order)
	require.Error(t, err)
	rec := w.record(acme)
	require.True(t, rec.Compensating())
	require.Equal(t, []string{"charge", "reserve"}, rec.Undo)
	require.Equal(t, 1, rec.Attempts, "the compensations count their own attempts")

	res, err := s.workflow().Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, res.Compensated)
	require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
	require.Equal(t, 1, w.provider.Effects("refunds"))
	require.Equal(t, 2, w.provider.MaxCalls("refunds"), "the same refund key both times")
}

// TestCompensationThatFailsForGoodLeavesTheRestListed: a refund the
// provider refuses (400) cannot be retried: the record fails with a 500,
// and what is still to undo stays listed for an operator. So does a
// refund failing until MaxAttempts is spent.
func TestCompensationThatFailsForGoodLeavesTheRestListed(t *testing.T) {
	for name, fault := range map[string]testapp.Fault{"permanent": {Status: 400}, "attempts spent": {Status: 503}} {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t)
			s := newSaga(w)
			s.fail["record"] = func(int) error { return phase.Permanent(errors.New("refused")) }
			w.provider.Fail("refunds", fault, fault, fault)
			e := w.engine(workflow.Config{MaxAttempts: 2})
			var res *workflow.Result
			var err error
			for range 2 {
				if res, err = s.workflow().Run(w.ctx, e, acme, order); err == nil {
					break
				}
			}
			require.NoError(t, err)
			require.True(t, res.Failed)
			require.Contains(t, string(res.Response.Body), "undoing what it had done failed too")
			rec := w.record(acme)
			require.Equal(t, recovery.StatusFailed, rec.Status)
			require.Equal(t, []string{"charge", "reserve"}, rec.Undo)
			require.Zero(t, w.provider.Effects("releases"), "nothing after a compensation that failed for good")
		})
	}
}

// TestCompensationOfAStepTheRunningVersionCannotUndoParks: a record
// compensating a step that the running definition declares without a
// compensation is parked, not failed or skipped.
func TestCompensationOfAStepTheRunningVersionCannotUndoParks(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	s.fail["record"] = func(int) error { return phase.Permanent(errors.New("refused")) }
	w.provider.Fail("refunds", testapp.Fault{Status: 503})
	_, err := s.workflow().Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.Error(t, err)
	require.True(t, w.record(acme).Compensating())

	without := workflow.Define("saga",
		foreign.Mutation("reserve", s.call("reservations"), s.undo("releases")),
		foreign.Mutation("charge", s.call("charges")),
		atomicStep("record", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil }),
		foreign.Mutation("ship", s.call("shipments")),
	)
	_, err = without.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.ErrorIs(t, err, workflow.ErrParked)
	require.Equal(t, recovery.StatusParked, w.record(acme).Status)
	require.Zero(t, w.provider.Effects("refunds"))
}

// TestABuildFromBeforeCompensationLeavesACompensatingRecordAlone: during a
// rolling deploy, a process of a build from before migration 0012 claims
// through the signatures it knows (the claim of 0010, the takeover of
// 0011). For a record that is compensating they take nothing over, so that
// build answers "in flight" instead of running the workflow forward after
// its failure was decided; this build finishes the undo.
func TestABuildFromBeforeCompensationLeavesACompensatingRecordAlone(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	s.fail["record"] = func(int) error { return phase.Permanent(errors.New("refused")) }
	w.provider.Fail("refunds", testapp.Fault{Status: 503})
	e := w.engine(workflow.Config{})
	_, err := s.workflow().Run(w.ctx, e, acme, order)
	require.Error(t, err)
	before := w.record(acme)
	require.True(t, before.Compensating())
	require.True(t, before.Released)

	var owner string
	require.NoError(t, w.db.QueryRow(w.ctx, `SELECT owner::text FROM onceflow_claim($1, $2, gen_random_uuid(), 'saga', $3, '{}', gen_random_uuid(),
		30000000, 'abandoned', NULL, $4)`, acme.Tenant, acme.ID, before.Fingerprint[:], before.Definition).Scan(&owner))
	require.Equal(t, before.Owner.String(), owner, "the old claim returns the record untouched")
	require.Zero(t, w.count(`SELECT count(*) FROM onceflow_take_over($1, $2, 'saga', NULL, NULL, gen_random_uuid(), 30000000, 'abandoned')`,
		acme.Tenant, acme.ID), "the old takeover takes nothing")
	require.Equal(t, before.Owner, w.record(acme).Owner)

	res, err := s.workflow().Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, res.Compensated)
	require.Zero(t, w.provider.Effects("shipments"))
}
