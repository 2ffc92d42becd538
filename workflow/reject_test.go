package workflow_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// chargeThenRecord is [foreign charge, atomic record]: charge honours its
// derived key at the provider; each step first asks its knob.
func chargeThenRecord(w *world, charge, record func(attempt int) error) *workflow.Workflow[Order, Paid] {
	return workflow.Define("charge_then_record",
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[Order, Paid]) error {
			if err := charge(c.Attempt); err != nil {
				return err
			}
			id, err := w.charge(ctx, c.Key)
			c.State.ChargeID = id
			return err
		}),
		atomicStep("record", func(_ context.Context, _ pgx.Tx, r *phase.Run[Order, Paid]) error {
			return record(r.Attempt)
		}),
	)
}

// TestRejectAfterTakeoverIsStored: attempt 1 charges and fails in the next
// phase (no recovery point); attempt 2 takes over and its charge step now
// rejects (a precondition it checks first fails). A Reject there may not
// delete the record: attempt 1's charge happened under it, and a fresh
// record would derive a new downstream key and charge again. It is stored
// like Respond, and every retry replays it.
//
// Before the fix, the record was deleted and the third run charged a
// second time.
func TestRejectAfterTakeoverIsStored(t *testing.T) {
	w := newWorld(t)
	wf := chargeThenRecord(w,
		func(attempt int) error {
			if attempt == 2 {
				return workflow.Reject(workflow.Problem(409, "the cart changed"))
			}
			return nil
		},
		func(attempt int) error {
			if attempt == 1 {
				return errors.New("database hiccup")
			}
			return nil
		})
	e := w.engine(workflow.Config{})
	_, err := wf.Run(w.ctx, e, acme, order)
	require.ErrorContains(t, err, "database hiccup")
	require.Equal(t, 1, w.provider.Effects("charges"))

	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.False(t, res.Rejected, "a Reject after a foreign call of an earlier attempt is stored")
	require.Equal(t, 409, res.Response.Status)

	again, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, 409, again.Response.Status)
	require.Equal(t, 1, w.provider.Effects("charges"), "one charge")
}

// TestRejectOfATakenOverKeyIsNotAnswered: attempt 1 stalls in its charge
// and its lease is taken over; when it wakes and rejects, the key is no
// longer its own, so it must not tell its caller "rejected" (which would
// invite a fresh request) nor delete anything: its caller gets the lost
// lease, and the record stays with its new owner.
func TestRejectOfATakenOverKeyIsNotAnswered(t *testing.T) {
	w := newWorld(t)
	stalled, wake := make(chan struct{}), make(chan struct{})
	wf := chargeThenRecord(w,
		func(attempt int) error {
			if attempt == 1 {
				close(stalled)
				<-wake
				return workflow.Reject(workflow.Problem(409, "the cart changed"))
			}
			return nil
		},
		func(int) error { return nil })
	e := w.engine(workflow.Config{})
	zombie := make(chan error, 1)
	go func() {
		res, err := wf.Run(w.ctx, e, acme, order)
		if err == nil && res.Rejected {
			err = errors.New("the zombie answered Rejected")
		}
		zombie <- err
	}()
	<-stalled
	require.NoError(t, e.Store().ExpireLease(w.ctx, acme))
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, 200, res.Response.Status)

	close(wake)
	require.ErrorIs(t, <-zombie, workflow.ErrLeaseLost)
	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusCompleted, rec.Status)
	require.Equal(t, 1, w.provider.Effects("charges"))
}

// TestRejectOfATakeoverBeforeAnyForeignStepLeavesNoRecord: when the
// workflow starts with an atomic phase, an earlier attempt that committed
// nothing can have done nothing outside the database, so a Reject of a
// takeover still frees the key.
func TestRejectOfATakeoverBeforeAnyForeignStepLeavesNoRecord(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	e := w.engine(workflow.Config{})
	w.before = func(_ context.Context, step string) error {
		if step == "create_order" {
			return errors.New("database hiccup")
		}
		return nil
	}
	_, err := wf.Run(w.ctx, e, acme, order)
	require.Error(t, err)
	require.Equal(t, 1, w.keys(), "the failed attempt left a resumable record")
	w.before = func(_ context.Context, step string) error {
		if step == "create_order" {
			return workflow.Reject(workflow.Problem(422, "amount too large"))
		}
		return nil
	}
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, res.Rejected)
	require.Zero(t, w.keys())
}
