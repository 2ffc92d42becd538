package workflow_test

// Attacks on compensation: ways a saga could keep money it should have
// refunded, or refund twice, against a real PostgreSQL and a provider over
// real HTTP.

import (
	"context"
	"errors"
	"net/http"
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
