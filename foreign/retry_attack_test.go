package foreign_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
)

// The last try's Retry-After is honoured too: when the other system asks
// for more than a third of the lease on the try that spends Max (or on the
// one try of a Mutation without Retry), the step defers rather than
// failing, which would hand the key back for an at-once takeover that
// calls again long before the time asked. Both count as an attempt.
// (Mutation caught: the Max check before the deferral, as it was.)
func TestRetryLastTryRetryAfterDefers(t *testing.T) {
	t.Parallel()
	asksAnHour := &foreign.HTTPError{Status: 503, RetryAfter: time.Hour}
	busyThenAsks := func(_ context.Context, call int) error {
		if call == 1 {
			return errBusy
		}
		return asksAnHour
	}
	calls, _, _, err := tries(t, context.Background(), 30*time.Second, busyThenAsks, foreign.Retry{Max: 2, Base: time.Millisecond})
	var deferred *phase.DeferError
	require.ErrorAs(t, err, &deferred)
	require.Equal(t, time.Hour, deferred.After)
	require.ErrorIs(t, err, asksAnHour)
	require.Equal(t, 2, calls)

	calls, _, _, err = tries(t, context.Background(), 30*time.Second,
		func(context.Context, int) error { return asksAnHour })
	require.ErrorAs(t, err, &deferred, "without Retry, the one try's Retry-After defers too")
	require.Equal(t, 1, calls)

	// A short Retry-After on the last try is an ordinary failure, and with
	// no lease known nothing defers.
	asksASecond := &foreign.HTTPError{Status: 503, RetryAfter: time.Second}
	_, _, _, err = tries(t, context.Background(), 30*time.Second, func(context.Context, int) error { return asksASecond })
	require.False(t, errorsAsDefer(err))
	_, _, _, err = tries(t, context.Background(), 0, func(context.Context, int) error { return asksAnHour })
	require.False(t, errorsAsDefer(err))
}

func errorsAsDefer(err error) bool {
	var deferred *phase.DeferError
	return errors.As(err, &deferred)
}

// Jitter draws over the wait that is slept, the backoff cut to a third of
// the lease: drawn over a Cap far beyond it and then cut, nearly every
// wait would be that third, and the callers of a recovering system would
// come back together. (Mutation caught: the cut after the draw, as it
// was: 99 waits of an hour's backoff, drawn then cut to 10ms, are 10ms
// all but about once in 360000.)
func TestRetryJitterIsDrawnWithinTheLease(t *testing.T) {
	t.Parallel()
	calls, slept, _, _ := tries(t, context.Background(), 30*time.Millisecond, failing,
		foreign.Retry{Max: foreign.RetryMaxLimit, Base: time.Hour, Jitter: true})
	require.Equal(t, foreign.RetryMaxLimit, calls)
	atCut := 0
	for _, d := range slept {
		require.LessOrEqual(t, d, 10*time.Millisecond)
		if d == 10*time.Millisecond {
			atCut++
		}
	}
	require.Less(t, atCut, len(slept)/2, "the waits are not spread below the cut: %v", slept)
}

// The longest Base a Retry accepts does not overflow the jitter's draw
// (rand.N(wait+1) panicked for a wait of math.MaxInt64), with or without a
// lease. (Mutation caught: rand.N(wait + 1) over a time.Duration.)
func TestRetryJitterOfTheLongestBackoff(t *testing.T) {
	t.Parallel()
	for _, lease := range []time.Duration{0, time.Minute} {
		require.NotPanics(t, func() {
			calls, slept, _, err := tries(t, context.Background(), lease, failing,
				foreign.Retry{Max: 2, Base: math.MaxInt64, Jitter: true})
			require.ErrorIs(t, err, errBusy)
			require.Equal(t, 2, calls)
			require.Len(t, slept, 1)
			require.GreaterOrEqual(t, slept[0], time.Duration(0))
		})
	}
}
