package workflow_test

import (
	"context"
	"errors"
	"sync"
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

// TestPermanentErrorFailsAtOnce: a step error marked phase.Permanent fails
// the key terminally after its first attempt, although MaxAttempts (the
// default, 10) would allow more: the stored 500, replayed to every retry,
// says nothing of the cause, which the record keeps. It holds for a
// foreign step and for the first atomic phase, whose claim rolled back
// with it.
func TestPermanentErrorFailsAtOnce(t *testing.T) {
	for _, step := range []string{"charge", "create_order"} {
		t.Run(step, func(t *testing.T) {
			w := newWorld(t)
			wf := w.checkout()
			e := w.engine(workflow.Config{})
			runs := 0
			w.before = func(_ context.Context, s string) error {
				if s == step {
					runs++
					return phase.Permanent(errors.New("card number is invalid"))
				}
				return nil
			}
			res, err := wf.Run(w.ctx, e, acme, order)
			require.NoError(t, err)
			require.True(t, res.Failed)
			require.Equal(t, 500, res.Response.Status)
			require.Equal(t, "application/problem+json", res.Response.Header.Get("Content-Type"))
			require.NotContains(t, string(res.Response.Body), "card number", "internal errors stay out of the response")

			rec, err := e.Store().Load(w.ctx, acme)
			require.NoError(t, err)
			require.Equal(t, recovery.StatusFailed, rec.Status)
			require.Contains(t, rec.LastError, "permanent: card number is invalid")

			replay, err := wf.Run(w.ctx, e, acme, order)
			require.NoError(t, err)
			require.True(t, replay.Replayed)
			require.True(t, replay.Failed)
			require.Equal(t, res.Response, replay.Response)
			require.Equal(t, 1, runs, "one attempt, and nothing runs after it")
			require.Zero(t, w.provider.Effects("charges"))
		})
	}
}

// deferring is a workflow whose foreign step defers its first call by
// after (as a provider's long Retry-After would make it) and charges at
// the provider on later ones; it records the derived key of every call.
type deferring struct {
	wf    *workflow.Workflow[Order, Paid]
	mu    sync.Mutex
	keys  []string // the derived key of each call of charge
	after time.Duration
	// always: every call defers, not only the first (set before a run).
	always bool
}

func (w *world) deferring(after time.Duration) *deferring {
	d := &deferring{after: after}
	d.wf = workflow.Define("deferring",
		atomicStep("create_order", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			return tx.QueryRow(ctx, `INSERT INTO orders (tenant, key, customer, amount, status)
				VALUES ($1, $2, $3, $4, 'new') RETURNING id`,
				r.Key.Tenant, r.Key.ID, r.Request.Customer, r.Request.Amount).Scan(&r.State.OrderID)
		}),
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[Order, Paid]) error {
			d.mu.Lock()
			d.keys = append(d.keys, c.Key)
			first := len(d.keys) == 1 || d.always
			d.mu.Unlock()
			if first {
				return phase.Defer(d.after, errors.New("provider answered 429, Retry-After: 90"))
			}
			id, err := testapp.Call(ctx, w.provider.URL, "charges", c.Key)
			c.State.ChargeID = id
			return err
		}),
		atomicStep("record_charge", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			_, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid', charge_id = $2 WHERE id = $1`, r.State.OrderID, r.State.ChargeID)
			return err
		}),
	).Finish(func(s *Paid) workflow.Response { return workflow.JSON(201, s) })
	return d
}

func (d *deferring) calls() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.keys...)
}

// requireDeferredFor requires err to be the ErrInFlight of a deferred
// record whose RetryAfter is the deferral, less at most the time since
// start, before which the deferral was made.
func requireDeferredFor(t *testing.T, err error, after time.Duration, start time.Time) {
	t.Helper()
	elapsed := time.Since(start)
	require.ErrorIs(t, err, workflow.ErrInFlight)
	var inFlight *recovery.InFlightError
	require.ErrorAs(t, err, &inFlight)
	require.True(t, inFlight.Deferred)
	require.LessOrEqual(t, inFlight.RetryAfter, after)
	require.GreaterOrEqual(t, inFlight.RetryAfter, after-elapsed)
}

// TestDeferredKeyWaitsUntilNotBefore: a step that returns phase.Defer hands
// the key back with a not-before time, counting an attempt; until
// then a client's retry and Engine.Resume get ErrInFlight with the time
// left, and nothing runs. Once the time has passed, a retry takes the
// record over and finishes it, calling the provider with the derived key
// the deferred call had.
func TestDeferredKeyWaitsUntilNotBefore(t *testing.T) {
	w := newWorld(t)
	const after = 90 * time.Second
	d := w.deferring(after)
	e := w.engine(workflow.Config{MaxAttempts: 2, Workflows: []workflow.Definition{d.wf}})
	start := time.Now()
	_, err := d.wf.Run(w.ctx, e, acme, order)
	var deferErr *phase.DeferError
	require.ErrorAs(t, err, &deferErr)
	require.ErrorContains(t, err, "Retry-After: 90")

	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusInFlight, rec.Status)
	require.True(t, rec.Released)
	require.False(t, rec.NotBefore.IsZero())
	require.Equal(t, 1, rec.Attempts, "a deferral counts, so that MaxAttempts bounds a downstream that defers for ever")
	require.Equal(t, "create_order", rec.RecoveryPoint)
	require.Contains(t, rec.LastError, "deferred for 1m30s")

	_, err = d.wf.Run(w.ctx, e, acme, order)
	requireDeferredFor(t, err, after, start)
	_, err = e.Resume(w.ctx, acme)
	requireDeferredFor(t, err, after, start)
	require.Len(t, d.calls(), 1, "nothing ran while deferred")

	_, err = w.db.Exec(w.ctx, `UPDATE onceflow_keys SET not_before = clock_timestamp() - interval '1 millisecond'`)
	require.NoError(t, err)
	res, err := d.wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
	require.Equal(t, "create_order", res.ResumedFrom)
	keys := d.calls()
	require.Len(t, keys, 2)
	require.Equal(t, keys[0], keys[1], "the call after the deferral has the deferred call's derived key")
	require.Equal(t, []string{keys[0]}, w.provider.Keys("charges"))
	require.Equal(t, 1, w.orders())
	rec, err = e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusCompleted, rec.Status)
	require.Equal(t, 1, rec.Attempts)
}

// TestDeferralsAreBoundedByMaxAttempts: a downstream that asks to be left
// alone on every call does not keep a key for ever: the MaxAttempts-th
// deferral fails the key terminally, with nothing deferred.
func TestDeferralsAreBoundedByMaxAttempts(t *testing.T) {
	w := newWorld(t)
	d := w.deferring(90 * time.Second)
	e := w.engine(workflow.Config{MaxAttempts: 2, Workflows: []workflow.Definition{d.wf}})
	_, err := d.wf.Run(w.ctx, e, acme, order)
	var deferErr *phase.DeferError
	require.ErrorAs(t, err, &deferErr)
	_, err = w.db.Exec(w.ctx, `UPDATE onceflow_keys SET not_before = clock_timestamp() - interval '1 millisecond'`)
	require.NoError(t, err)
	d.mu.Lock()
	d.always = true
	d.mu.Unlock()
	res, err := d.wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, res.Failed, "the second deferral is the last attempt")
	require.Equal(t, 500, res.Response.Status)
}
