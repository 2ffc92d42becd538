package foreign_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// A key that defers because its downstream's slots are all taken has not
// failed: nothing was called. Deferring for its turn more often than
// MaxAttempts does not fail it terminally; once a slot frees it charges
// once and completes. (Mutation caught: a deferral for a turn counted as
// an attempt, so that a busy downstream failed the key with a stored 500.)
func TestPaceTurnDeferralsDoNotSpendAttempts(t *testing.T) {
	const lease = 2 * time.Second
	limits := map[string]foreign.Pace{"payments": {Concurrency: 1}}
	s := newShop(t, workflow.Config{Lease: lease, MaxAttempts: 2, Pacing: limits}, foreign.Limit("payments"))
	other, err := foreign.NewPacer(s.db, foreign.PacerConfig{Limits: limits})
	require.NoError(t, err)
	release := make(chan struct{})
	held := blocked(s.ctx, other, time.Minute, release) // another key's call holds the only slot

	for range 3 {
		res, err := s.checkout.Run(s.ctx, s.engine, acme, order)
		var wait *foreign.WaitError
		require.ErrorAs(t, err, &wait, "%+v", res)
		_, err = s.db.Exec(s.ctx, `UPDATE onceflow_keys SET not_before = clock_timestamp() - interval '1 millisecond'`)
		require.NoError(t, err)
	}
	close(release)
	require.NoError(t, <-held)
	res, err := s.checkout.Run(s.ctx, s.engine, acme, order)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	require.Equal(t, 1, s.provider.Effects("charges"))
}

// A try that must wait for its turn after an earlier try of the same
// attempt failed does spend the attempt: the attempt called, and failed,
// and a downstream that always fails must not be called for ever. With
// MaxAttempts 1 the key fails for good. (Mutation caught: afterFailure
// returning the deferral as it is, so that the failing attempt counts
// nothing.)
func TestPaceTurnDeferralAfterAFailedTrySpendsTheAttempt(t *testing.T) {
	const lease = 2 * time.Second
	limits := map[string]foreign.Pace{"payments": {Concurrency: 1}}
	s := newShop(t, workflow.Config{})
	engine, err := workflow.NewEngine(s.db, workflow.Config{Lease: lease, MaxAttempts: 1, Pacing: limits})
	require.NoError(t, err)
	other, err := foreign.NewPacer(s.db, foreign.PacerConfig{Limits: limits})
	require.NoError(t, err)
	release := make(chan struct{})
	defer close(release)
	var held <-chan error
	between := func(context.Context, time.Duration) error {
		held = blocked(s.ctx, other, time.Minute, release) // another key's call takes the only slot between the tries
		return nil
	}
	checkout := testapp.Checkout(s.provider.URL, testapp.Options{Charge: []foreign.Option{
		foreign.Limit("payments"), foreign.Retry{Max: 2}, foreign.WithSleep(between)}})
	s.provider.Fail("charges", testapp.Fault{Status: 503})

	res, err := checkout.Run(s.ctx, engine, acme, order)
	require.NoError(t, err)
	require.True(t, res.Failed, "the attempt called and failed: it counts")
	require.NotNil(t, held)
}

// A compensation runs under its step's Limit: one that defers because the
// downstream's slots are taken, more often than MaxAttempts, is not failed
// for good (which would leave the charge for an operator); once a slot
// frees, the refund is made, once. (Mutation caught: a compensation's
// deferral for its turn counted against MaxAttempts.)
func TestPaceTurnDeferralsDoNotFailACompensation(t *testing.T) {
	const lease = 2 * time.Second
	limits := map[string]foreign.Pace{"payments": {Concurrency: 1}}
	s := newShop(t, workflow.Config{})
	engine, err := workflow.NewEngine(s.db, workflow.Config{Lease: lease, MaxAttempts: 2, Pacing: limits})
	require.NoError(t, err)
	other, err := foreign.NewPacer(s.db, foreign.PacerConfig{Limits: limits})
	require.NoError(t, err)
	release := make(chan struct{})
	var held <-chan error
	checkout := testapp.Checkout(s.provider.URL, testapp.Options{
		Charge: []foreign.Option{foreign.Limit("payments"), foreign.Compensate(testapp.Refund(s.provider.URL))},
		Before: func(_ context.Context, step string) error {
			if step != "record_charge" {
				return nil
			}
			if held == nil {
				held = blocked(s.ctx, other, time.Minute, release) // another key's call takes the only slot
			}
			return phase.Permanent(errors.New("the order cannot be kept"))
		},
	})

	for range 3 {
		res, err := checkout.Run(s.ctx, engine, acme, order)
		var wait *foreign.WaitError
		require.ErrorAs(t, err, &wait, "%+v", res)
		_, err = s.db.Exec(s.ctx, `UPDATE onceflow_keys SET not_before = clock_timestamp() - interval '1 millisecond'`)
		require.NoError(t, err)
	}
	close(release)
	require.NoError(t, <-held)
	res, err := checkout.Run(s.ctx, engine, acme, order)
	require.NoError(t, err)
	require.True(t, res.Compensated, "%+v", res)
	require.Equal(t, 1, s.provider.Effects("refunds"))
}
