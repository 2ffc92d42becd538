package workflow_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// slowCall is a workflow whose one foreign call always outlives its
// context, and counts how often it is sent. Each call is announced on
// entered, when it is not nil.
func slowCall(calls *atomic.Int32, entered chan<- struct{}) *workflow.Workflow[Order, Paid] {
	return workflow.Define("slow_call",
		foreign.Mutation("call", func(ctx context.Context, _ *foreign.Call[Order, Paid]) error {
			calls.Add(1)
			if entered != nil {
				entered <- struct{}{}
			}
			<-ctx.Done()
			return ctx.Err()
		}))
}

// TestDeadlineCountsAsAnAttempt: a step that always outlives its deadline
// (a client's, or the completer's ResumeTimeout) is a failing attempt, so
// MaxAttempts ends it: with MaxAttempts 2 the call is sent twice, then the
// key fails terminally, however often it is resumed.
//
// Before the fix, such an attempt handed its lease back uncounted and was
// resumed for ever: 7 calls after 6 resumptions.
func TestDeadlineCountsAsAnAttempt(t *testing.T) {
	w := newWorld(t)
	var calls atomic.Int32
	wf := slowCall(&calls, nil)
	e := w.engine(workflow.Config{MaxAttempts: 2, Workflows: []workflow.Definition{wf}})
	// A deadline far longer than a claim takes, even on a loaded machine,
	// so that it always ends the call, never the claim.
	withDeadline := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(w.ctx, time.Second)
	}
	ctx, cancel := withDeadline()
	_, err := wf.Run(ctx, e, acme, order)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	for range 6 { // as the completer would, each run under its ResumeTimeout
		ctx, cancel := withDeadline()
		_, _ = e.Resume(ctx, acme)
		cancel()
	}
	require.Equal(t, int32(2), calls.Load(), "one call per counted attempt")
	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusFailed, rec.Status)
	require.Equal(t, 500, rec.Response.Status)
}

// TestCancelAfterAForeignCallCounts: a caller that goes away while a
// foreign call runs has had an effect started on its behalf; the attempt
// counts, so a client that always gives up during a slow call cannot have
// it re-sent for ever.
func TestCancelAfterAForeignCallCounts(t *testing.T) {
	w := newWorld(t)
	var calls atomic.Int32
	entered := make(chan struct{}, 1)
	wf := slowCall(&calls, entered)
	e := w.engine(workflow.Config{MaxAttempts: 3})
	for attempt := 1; attempt <= 3; attempt++ {
		ctx, cancel := context.WithCancel(w.ctx)
		go func() { <-entered; cancel() }()
		res, err := wf.Run(ctx, e, acme, order)
		cancel()
		if attempt < 3 {
			require.ErrorIs(t, err, context.Canceled)
		} else {
			require.NoError(t, err)
			require.True(t, res.Failed, "the third counted attempt fails the key")
		}
	}
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	res, err := wf.Run(ctx, e, acme, order)
	require.NoError(t, err, "a retry gets the stored failure without calling again")
	require.True(t, res.Replayed && res.Failed)
	require.Equal(t, int32(3), calls.Load())
	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusFailed, rec.Status)
}
