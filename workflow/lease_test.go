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

// leaseStillValid reports, by the database clock, whether acme's lease
// has not ended yet: no other attempt could have taken the key over.
func leaseStillValid(w *world) bool {
	var valid bool
	err := w.db.QueryRow(w.ctx, `SELECT locked_until > clock_timestamp() FROM onceflow_keys
		WHERE tenant_id = $1 AND key = $2`, acme.Tenant, acme.ID).Scan(&valid)
	return err == nil && valid
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
				validAtCancel <- leaseStillValid(w)
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
