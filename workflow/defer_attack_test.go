package workflow_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// TestDeferralFromTheFirstAtomicPhase: the first atomic phase, whose claim
// is uncommitted in its transaction, may defer too. Its writes roll back
// with the claim, and the key is claimed again on its own only to be
// handed back deferred: a retry meanwhile runs nothing and gets ErrInFlight
// with the time left; once the time has passed a retry runs the workflow
// from the start, with one order.
func TestDeferralFromTheFirstAtomicPhase(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	e := w.engine(workflow.Config{})
	const after = time.Hour
	runs := 0
	w.before = func(_ context.Context, s string) error {
		if s == "create_order" {
			runs++
			if runs == 1 {
				return phase.Defer(after, errors.New("inventory answered 429"))
			}
		}
		return nil
	}
	start := time.Now()
	_, err := wf.Run(w.ctx, e, acme, order)
	var deferErr *phase.DeferError
	require.ErrorAs(t, err, &deferErr)
	require.Zero(t, w.orders(), "the phase's writes rolled back")

	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusInFlight, rec.Status)
	require.True(t, rec.Released)
	require.False(t, rec.NotBefore.IsZero())
	require.Empty(t, rec.RecoveryPoint)
	require.Equal(t, 1, rec.Attempts)

	_, err = wf.Run(w.ctx, e, acme, order)
	requireDeferredFor(t, err, after, start)
	_, err = e.Resume(w.ctx, acme)
	requireDeferredFor(t, err, after, start)
	require.Equal(t, 1, runs, "nothing ran while deferred")

	_, err = w.db.Exec(w.ctx, `UPDATE onceflow_keys SET not_before = clock_timestamp() - interval '1 millisecond'`)
	require.NoError(t, err)
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
	require.Equal(t, 1, w.orders())
	require.Equal(t, 1, w.provider.Effects("charges"))
	rec, err = e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Zero(t, rec.NotBefore, "finishing clears the deferral")
}
