package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// leaseValidAt reports whether acme's lease was still valid at at. The
// test's database runs on this machine, unskewed, so its clock and the
// process's agree; comparing with the moment the step saw its context end,
// rather than asking the database "now", keeps the query's own delay on a
// loaded machine out of the measure.
func leaseValidAt(w *world, at time.Time) bool {
	var until time.Time
	err := w.db.QueryRow(w.ctx, `SELECT locked_until FROM onceflow_keys
		WHERE tenant_id = $1 AND key = $2`, acme.Tenant, acme.ID).Scan(&until)
	return err == nil && at.Before(until)
}

// TestLeaseDeadlineSpansTheAttempt: with every renewal failing, an attempt
// whose steps each take well under a lease, but together more, is stopped
// while its lease is still valid by the database clock, so that no other
// attempt can run beside it. The measure of "a lease without a successful
// renewal" runs from the attempt's last extension, across steps.
//
// Before the fix, it restarted at every step: the second step was
// cancelled half a lease after the lease had ended, by which time another
// attempt could have taken the key over.
func TestLeaseDeadlineSpansTheAttempt(t *testing.T) {
	w := newWorld(t)
	// Real time is the point here: the margins below are fractions of it.
	const lease = 2 * time.Second
	db := &failingRenewals{Pool: w.db}
	db.fail.Store(true)
	validAtCancel := make(chan bool, 1)
	wf := workflow.Define("two_halves",
		foreign.Mutation("first_half", func(ctx context.Context, _ *foreign.Call[Order, Paid]) error {
			select { // half a lease of work, unless stopped
			case <-time.After(lease / 2):
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}),
		phase.Atomic("second_half", func(ctx context.Context, _ pgx.Tx, _ *phase.Run[Order, Paid]) error {
			select {
			case <-ctx.Done():
				validAtCancel <- leaseValidAt(w, time.Now())
				return context.Cause(ctx)
			case <-time.After(3 * lease):
				validAtCancel <- false
				return nil
			}
		}))
	e, err := workflow.NewEngine(db, workflow.Config{Lease: lease})
	require.NoError(t, err)
	_, err = wf.Run(w.ctx, e, acme, order)
	require.ErrorIs(t, err, workflow.ErrLeaseLost)
	require.ErrorContains(t, err, "no renewal succeeded for a whole lease")
	require.True(t, <-validAtCancel, "the second step was stopped while the lease was still valid")
}
