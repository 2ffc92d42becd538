package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

func TestRunCompletesAndReplays(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	e := w.engine(workflow.Config{})

	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, recovery.OutcomeNew, res.Outcome)
	require.Equal(t, 201, res.Response.Status)
	require.JSONEq(t, `{"order_id":1,"charge_id":"ch_1","status":"paid"}`, string(res.Response.Body))
	require.Equal(t, "application/json", res.Response.Header.Get("Content-Type"))

	again, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, recovery.OutcomeReplay, again.Outcome)
	require.Equal(t, res.Response, again.Response, "the replay is the original response, verbatim")
	require.Equal(t, 1, w.orders())
	require.Equal(t, 1, w.ledger())
	require.Equal(t, 1, w.provider.Effects("charges"))

	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusCompleted, rec.Status)
	require.Equal(t, "record_charge", rec.RecoveryPoint)
	require.JSONEq(t, `{"order_id":1,"charge_id":"ch_1","status":"paid"}`, string(rec.State))
}

func TestRunMismatchAndInFlight(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	e := w.engine(workflow.Config{})
	entered, release := make(chan struct{}), make(chan struct{})
	w.before = func(ctx context.Context, step string) error {
		if step == "charge" {
			close(entered)
			<-release
		}
		return nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := wf.Run(w.ctx, e, acme, order)
		done <- err
	}()
	<-entered

	_, err := wf.Run(w.ctx, e, acme, order)
	require.ErrorIs(t, err, workflow.ErrInFlight)
	var inFlight *recovery.InFlightError
	require.True(t, errors.As(err, &inFlight))
	require.Positive(t, inFlight.RetryAfter)

	other := order
	other.Amount = 1
	_, err = wf.Run(w.ctx, e, acme, other)
	require.ErrorIs(t, err, workflow.ErrMismatch)

	close(release)
	require.NoError(t, <-done)
	_, err = wf.Run(w.ctx, e, acme, other)
	require.ErrorIs(t, err, workflow.ErrMismatch, "a finished key with another request is still a mismatch")
	require.Equal(t, 1, w.provider.Effects("charges"))
}

// TestRespondIsStoredAndReplayed: a business outcome (a declined card)
// commits the phase's writes with the response and replays it.
func TestRespondIsStoredAndReplayed(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	e := w.engine(workflow.Config{})
	declined := Order{Customer: "c-1", Amount: 1999, Card: "decline"}

	res, err := wf.Run(w.ctx, e, acme, declined)
	require.NoError(t, err)
	require.Equal(t, 402, res.Response.Status)
	require.Equal(t, "application/problem+json", res.Response.Header.Get("Content-Type"))
	require.Equal(t, 1, w.count(`SELECT count(*) FROM orders WHERE status = 'declined'`),
		"the phase's writes committed with the response")
	require.Zero(t, w.ledger())

	replay, err := wf.Run(w.ctx, e, acme, declined)
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Equal(t, res.Response, replay.Response)
	require.Equal(t, 1, w.orders())
}

// TestRejectLeavesNoRecord: a validation failure before anything committed
// rolls back the phase and the claim; the client may retry at once.
func TestRejectLeavesNoRecord(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	e := w.engine(workflow.Config{})
	rejecting := true
	w.before = func(ctx context.Context, step string) error {
		if step == "create_order" && rejecting {
			return workflow.Reject(workflow.Problem(422, "amount too large"))
		}
		return nil
	}
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, res.Rejected)
	require.Equal(t, 422, res.Response.Status)
	require.Zero(t, w.keys(), "no record is kept")
	require.Zero(t, w.orders())

	rejecting = false
	res, err = wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeNew, res.Outcome, "the same key runs afresh")
	require.Equal(t, 201, res.Response.Status)
}

// TestRejectFromForeignStepBeforeCommit: a workflow whose first step is
// foreign has committed its claim alone; a Reject there deletes it.
func TestRejectFromForeignStepBeforeCommit(t *testing.T) {
	w := newWorld(t)
	wf := workflow.Define("quote",
		foreignStep("validate", func() error { return workflow.Reject(workflow.Problem(400, "bad card")) }),
		foreignStep("never", func() error { t.Error("the step after a Reject ran"); return nil }),
	)
	e := w.engine(workflow.Config{})
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, res.Rejected)
	require.Equal(t, 400, res.Response.Status)
	require.Zero(t, w.keys())
}

// TestRejectAfterCommitActsAsRespond: once a step committed there are
// effects to answer for, so the response is stored.
func TestRejectAfterCommitActsAsRespond(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	e := w.engine(workflow.Config{})
	w.before = func(ctx context.Context, step string) error {
		if step == "record_charge" {
			return workflow.Reject(workflow.Problem(409, "too late to reject"))
		}
		return nil
	}
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.False(t, res.Rejected)
	require.Equal(t, 409, res.Response.Status)
	replay, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Equal(t, 409, replay.Response.Status)
	require.Equal(t, 1, w.orders(), "create_order committed before the Reject and stays")
}

// TestErrorReleasesAndRetryResumes: a failing step rolls back its writes,
// releases the lease, counts the attempt and keeps the record at its
// recovery point; a retry takes over at once and resumes there.
func TestErrorReleasesAndRetryResumes(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	e := w.engine(workflow.Config{})
	failures := 1
	w.before = func(ctx context.Context, step string) error {
		if step == "record_charge" && failures > 0 {
			failures--
			return errors.New("ledger unavailable")
		}
		return nil
	}
	_, err := wf.Run(w.ctx, e, acme, order)
	var stepErr *workflow.StepError
	require.ErrorAs(t, err, &stepErr)
	require.Equal(t, "record_charge", stepErr.Step)
	require.Equal(t, 1, stepErr.Attempt)
	require.ErrorContains(t, err, "ledger unavailable")

	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusInFlight, rec.Status)
	require.True(t, rec.Released, "the lease is handed back")
	require.Equal(t, 1, rec.Attempts)
	require.Equal(t, "create_order", rec.RecoveryPoint, "the charge's result was not committed")
	require.Contains(t, rec.LastError, "ledger unavailable")
	require.Zero(t, w.ledger(), "the failed phase's writes rolled back")

	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
	require.Equal(t, "create_order", res.ResumedFrom)
	require.Equal(t, 201, res.Response.Status)
	require.Equal(t, 1, w.orders(), "create_order did not run again")
	require.Equal(t, 1, w.ledger())
	require.Equal(t, 1, w.provider.Effects("charges"), "the charge ran twice with one key: one effect")
	require.Equal(t, 2, w.provider.MaxCalls("charges"))
}

// TestErrorInFirstPhaseKeepsAResumableRecord: the claim folded into the
// first phase rolls back with it, yet the failure is recorded.
func TestErrorInFirstPhaseKeepsAResumableRecord(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	e := w.engine(workflow.Config{})
	failures := 1
	w.before = func(ctx context.Context, step string) error {
		if step == "create_order" && failures > 0 {
			failures--
			return errors.New("orders table locked")
		}
		return nil
	}
	_, err := wf.Run(w.ctx, e, acme, order)
	require.ErrorContains(t, err, "orders table locked")
	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, 1, rec.Attempts)
	require.True(t, rec.Released)
	require.Empty(t, rec.RecoveryPoint)
	require.Zero(t, w.orders())

	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
	require.Equal(t, 201, res.Response.Status)
	require.Equal(t, 1, w.orders())
}

func TestPanicIsRecoveredLikeAnError(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	e := w.engine(workflow.Config{})
	panics := 1
	w.before = func(ctx context.Context, step string) error {
		if step == "charge" && panics > 0 {
			panics--
			panic("nil map in the provider client")
		}
		return nil
	}
	_, err := wf.Run(w.ctx, e, acme, order)
	require.ErrorContains(t, err, "nil map in the provider client")
	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.True(t, rec.Released)
	require.Equal(t, 1, rec.Attempts)
	require.Equal(t, "create_order", rec.RecoveryPoint)

	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	require.Equal(t, 1, w.orders())
}

// TestMaxAttemptsFailsTerminally: after MaxAttempts failed attempts the key
// stores a 500 that every retry replays; nothing runs again.
func TestMaxAttemptsFailsTerminally(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	e := w.engine(workflow.Config{MaxAttempts: 3})
	runs := 0
	w.before = func(ctx context.Context, step string) error {
		if step == "charge" {
			runs++
			return fmt.Errorf("provider down (%d)", runs)
		}
		return nil
	}
	for range 2 {
		_, err := wf.Run(w.ctx, e, acme, order)
		require.ErrorContains(t, err, "provider down")
	}
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, res.Failed)
	require.Equal(t, 500, res.Response.Status)
	require.Equal(t, "application/problem+json", res.Response.Header.Get("Content-Type"))
	require.NotContains(t, string(res.Response.Body), "provider down", "internal errors stay out of the response")

	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusFailed, rec.Status)
	require.Contains(t, rec.LastError, "provider down (3)")

	replay, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.True(t, replay.Failed)
	require.Equal(t, res.Response, replay.Response)
	require.Equal(t, 3, runs, "nothing runs after the terminal failure")
}

// TestConcurrentRunsExecuteOnce: 32 concurrent runs of one key execute the
// workflow once; every other run gets the key in flight or the replay.
func TestConcurrentRunsExecuteOnce(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	e := w.engine(workflow.Config{})
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		start   = make(chan struct{})
		bodies  = map[string]int{}
		other   = map[string]int{}
		fresh   int
		replays int
	)
	for range 32 {
		wg.Go(func() {
			<-start
			res, err := wf.Run(w.ctx, e, acme, order)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, workflow.ErrInFlight):
				other["in flight"]++
			case err != nil:
				other[err.Error()]++
			case res.Replayed:
				replays++
				bodies[string(res.Response.Body)]++
			default:
				fresh++
				bodies[string(res.Response.Body)]++
			}
		})
	}
	close(start)
	wg.Wait()
	require.Equal(t, 1, fresh, "exactly one run executed; others: %v", other)
	require.Equal(t, 32, fresh+replays+other["in flight"], "unexpected outcomes: %v", other)
	require.Len(t, bodies, 1, "every answer is the same response")
	require.Equal(t, 1, w.orders())
	require.Equal(t, 1, w.provider.Effects("charges"))
}

func TestInvalidInputWritesNothing(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	e := w.engine(workflow.Config{})
	_, err := wf.Run(w.ctx, e, workflow.Key{Tenant: "", ID: "k"}, order)
	require.ErrorIs(t, err, workflow.ErrInvalidInput)
	_, err = wf.Run(w.ctx, e, workflow.Key{Tenant: "t", ID: "bad\nkey"}, order)
	require.ErrorIs(t, err, workflow.ErrInvalidInput)
	require.Zero(t, w.keys())
	require.Zero(t, w.orders())

	_, err = workflow.NewEngine(w.db, workflow.Config{MaxAttempts: -2})
	require.ErrorIs(t, err, workflow.ErrInvalidInput)
	require.NoError(t, e.Register(wf))
	require.ErrorIs(t, e.Register(w.checkout()), workflow.ErrInvalidInput,
		"another definition under a registered name")
}

// TestRunByAnotherPrincipalIsForbidden: a key's record answers only the
// principal that made it (AsPrincipal). Another principal of the same
// tenant, or none, gets ErrForbidden: it neither resumes a released record
// nor gets the stored response.
func TestRunByAnotherPrincipalIsForbidden(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	e := w.engine(workflow.Config{})
	failed := false
	w.before = func(ctx context.Context, step string) error {
		if step == "charge" && !failed {
			failed = true
			return errors.New("provider down")
		}
		return nil
	}
	_, err := wf.Run(w.ctx, e, acme, order, workflow.AsPrincipal("alice"))
	var stepErr *workflow.StepError
	require.ErrorAs(t, err, &stepErr)

	others := func(state string) {
		t.Helper()
		for _, opts := range [][]workflow.RunOption{{workflow.AsPrincipal("bob")}, nil} {
			_, err := wf.Run(w.ctx, e, acme, order, opts...)
			require.ErrorIs(t, err, workflow.ErrForbidden, state)
		}
	}
	others("released")
	require.Zero(t, w.provider.Effects("charges"), "no other principal resumed the record")

	res, err := wf.Run(w.ctx, e, acme, order, workflow.AsPrincipal("alice"))
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
	others("completed")
	again, err := wf.Run(w.ctx, e, acme, order, workflow.AsPrincipal("alice"))
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, 1, w.provider.Effects("charges"))
}
