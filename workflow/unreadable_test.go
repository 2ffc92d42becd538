package workflow_test

// A record whose stored request or state the running definition cannot
// decode is parked for an operator, whatever wrote it: never failed, and
// never compensated with a request or a state nobody read.

import (
	"context"
	"encoding/json"
	"errors"
	"math"
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

// wallet is a state whose balance is of type N: a release may change N.
type wallet[N any] struct {
	ChargeID string `json:"charge_id,omitempty"`
	Balance  N      `json:"balance"`
}

// walletFlow is charge (foreign, undone by a refund) → debit (atomic, sets
// the balance with set) → finish (atomic).
func walletFlow[N any](w *world, set func(*N)) *workflow.Workflow[Order, wallet[N]] {
	charge := func(ctx context.Context, c *foreign.Call[Order, wallet[N]]) error {
		id, err := testapp.Call(ctx, w.provider.URL, "charges", c.Key)
		c.State.ChargeID = id
		return err
	}
	refund := foreign.Compensate(func(ctx context.Context, c *foreign.Call[Order, wallet[N]]) error {
		_, err := testapp.CallUndoing(ctx, w.provider.URL, "refunds", c.Key, c.Compensates)
		return err
	})
	return workflow.Define("wallet",
		foreign.Mutation("charge", charge, refund),
		phase.Atomic("debit", func(_ context.Context, _ pgx.Tx, r *phase.Run[Order, wallet[N]]) error {
			set(&r.State.Balance)
			return nil
		}),
		phase.Atomic("finish", func(context.Context, pgx.Tx, *phase.Run[Order, wallet[N]]) error { return nil }),
	)
}

// resumeUntilSettled resumes acme under e, as retries and the completer
// would, until the record is finished or parked (at most tries times), and
// returns the last resume's error.
func (w *world) resumeUntilSettled(e *workflow.Engine, tries int) error {
	w.t.Helper()
	var err error
	for range tries {
		rec := w.record(acme)
		if rec.Finished() || rec.Status == recovery.StatusParked {
			break
		}
		require.NoError(w.t, e.Store().ExpireLease(w.ctx, acme))
		_, err = e.Resume(w.ctx, acme)
	}
	return err
}

// strictBalance reads only balances of at least zero: a release that
// tightened its JSON decoding, keeping the definition as it was.
type strictBalance int64

func (b *strictBalance) UnmarshalJSON(data []byte) error {
	var n int64
	if err := json.Unmarshal(data, &n); err != nil {
		return err
	}
	if n < 0 {
		return errors.New("a balance below zero")
	}
	*b = strictBalance(n)
	return nil
}

// TestAStateItsOwnDefinitionCannotReadParks: the committed state does not
// decode under the very definition that wrote it. Every attempt would read
// the same JSON and fail; once the attempts ran out the workflow would
// start undoing the charge with a state it never read. The record is
// parked instead at the first attempt, the reason readable in the record,
// the charge neither repeated nor refunded blind.
func TestAStateItsOwnDefinitionCannotReadParks(t *testing.T) {
	w := newWorld(t)
	wf := walletFlow(w, func(b *strictBalance) { *b = -1 })
	w.crashIn(wf, func(e *workflow.Engine) error { _, err := wf.Run(w.ctx, e, acme, order); return err },
		workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "debit"}, acme)

	err := w.resumeUntilSettled(w.engine(workflow.Config{MaxAttempts: 2, Workflows: []workflow.Definition{wf}}), 4)
	require.ErrorIs(t, err, workflow.ErrParked)
	var parked *recovery.ParkedError
	require.ErrorAs(t, err, &parked)
	require.Contains(t, parked.Reason, "cannot read the state")
	rec := w.record(acme)
	require.Equal(t, recovery.StatusParked, rec.Status, "last error: %s", rec.LastError)
	require.Contains(t, rec.LastError, "a balance below zero")
	require.Empty(t, rec.Undo)
	var kept map[string]any
	require.NoError(t, json.Unmarshal(rec.State, &kept))
	require.Equal(t, -1.0, kept["balance"], "the state is kept")
	require.NotEmpty(t, kept["charge_id"])
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.Zero(t, w.provider.Effects("refunds"))
}

// TestAChangedIntegerKindParksAndUndoesNothingBlind: a release changed a
// state field from int64 to uint32, and a record holds -1 there. It must
// not fail its attempts reading it and then undo the charge with nothing
// read: it parks, the charge made once and not refunded.
func TestAChangedIntegerKindParksAndUndoesNothingBlind(t *testing.T) {
	w := newWorld(t)
	v1 := walletFlow(w, func(b *int64) { *b = -1 })
	w.crashIn(v1, func(e *workflow.Engine) error { _, err := v1.Run(w.ctx, e, acme, order); return err },
		workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "debit"}, acme)

	v2 := walletFlow(w, func(*uint32) {})
	err := w.resumeUntilSettled(w.engine(workflow.Config{MaxAttempts: 2, Workflows: []workflow.Definition{v2}}), 4)
	require.ErrorIs(t, err, workflow.ErrParked)
	rec := w.record(acme)
	require.Equal(t, recovery.StatusParked, rec.Status, "last error: %s", rec.LastError)
	require.Contains(t, rec.LastError, "cannot read the state")
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.Zero(t, w.provider.Effects("refunds"))
}

// TestARequestItsDefinitionCannotReadParks: a release changed the request
// type's JSON (customer became a number), keeping the definition's
// fingerprint, which does not cover the request. A record that was
// compensating when the release came must not fail its attempts reading
// the request and end with the charge kept: it parks with its undo list,
// and once an operator resumes it under a definition that reads it, the
// compensations run, once each.
func TestARequestItsDefinitionCannotReadParks(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	s.fail["record"] = func(int) error { return phase.Permanent(errors.New("refused")) }
	w.provider.Fail("refunds", testapp.Fault{Status: http.StatusServiceUnavailable})
	_, err := s.workflow().Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.Error(t, err)
	require.True(t, w.record(acme).Compensating())

	err = w.resumeUntilSettled(w.engine(workflow.Config{MaxAttempts: 2, Workflows: []workflow.Definition{sagaAs[unreadableOrder](s)}}), 4)
	require.ErrorIs(t, err, workflow.ErrParked)
	rec := w.record(acme)
	require.Equal(t, recovery.StatusParked, rec.Status, "last error: %s", rec.LastError)
	require.Contains(t, rec.LastError, "cannot read its stored request")
	require.Equal(t, []string{"charge", "reserve"}, rec.Undo)
	require.Zero(t, w.provider.Effects("refunds"))
	require.NotContains(t, s.logged(), "refunds with an unread request")

	e := w.engine(workflow.Config{Workflows: []workflow.Definition{s.workflow()}})
	res, err := e.ResumeAs(w.ctx, acme, s.workflow().Spec().Version)
	require.NoError(t, err)
	require.True(t, res.Compensated)
	require.Equal(t, 1, w.provider.Effects("refunds"))
	require.Equal(t, 1, w.provider.Effects("releases"))
}

// rated is a state a step can make unwritable: encoding/json refuses NaN.
type rated struct {
	OrderID  int64   `json:"order_id"`
	ChargeID string  `json:"charge_id,omitempty"`
	Rate     float64 `json:"rate"`
}

// TestAStateThatCannotBeWrittenAfterAChargeIsUndone: create (atomic) →
// charge (foreign, undone by a refund), which sets a NaN in the state →
// record (atomic). No attempt can commit the charge's result, and each
// charges again with the same key. When the attempts run out, the charge
// must be refunded, the compensation seeing the state as last committed,
// not the failure stored with the charge kept.
func TestAStateThatCannotBeWrittenAfterAChargeIsUndone(t *testing.T) {
	w := newWorld(t)
	var (
		mu   sync.Mutex
		seen []rated // the state each refund had
	)
	wf := workflow.Define("rated",
		phase.Atomic("create", func(_ context.Context, _ pgx.Tx, r *phase.Run[Order, rated]) error {
			r.State.OrderID = 7
			return nil
		}),
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[Order, rated]) error {
			id, err := testapp.Call(ctx, w.provider.URL, "charges", c.Key)
			c.State.ChargeID, c.State.Rate = id, math.NaN()
			return err
		}, foreign.Compensate(func(ctx context.Context, c *foreign.Call[Order, rated]) error {
			mu.Lock()
			seen = append(seen, c.State)
			mu.Unlock()
			_, err := testapp.CallUndoing(ctx, w.provider.URL, "refunds", c.Key, c.Compensates)
			return err
		})),
		phase.Atomic("record", func(context.Context, pgx.Tx, *phase.Run[Order, rated]) error { return nil }),
	)
	e := w.engine(workflow.Config{MaxAttempts: 2})
	_, err := wf.Run(w.ctx, e, acme, order)
	require.ErrorContains(t, err, "encode state")
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, res.Compensated, "failed %v: %s", res.Failed, res.Response.Body)
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.Equal(t, 1, w.provider.Effects("refunds"))
	require.Equal(t, recovery.StatusCompensated, w.record(acme).Status)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []rated{{OrderID: 7}}, seen, "the refund saw the state as last committed")
}
