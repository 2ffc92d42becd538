package foreign_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/phase"
)

// tries runs a Mutation of fn with opts once, as the engine runs a foreign
// step, under lease, and returns the calls made, the waits
// slept, the retries reported and its error.
func tries(t *testing.T, ctx context.Context, lease time.Duration, fn func(ctx context.Context, call int) error,
	opts ...foreign.Option) (calls int, slept, reported []time.Duration, err error) {
	t.Helper()
	w := &waits{}
	step := foreign.Mutation("call", func(ctx context.Context, _ *foreign.Call[int, int]) error {
		calls++
		return fn(ctx, calls)
	}, append([]foreign.Option{foreign.WithSleep(w.sleep)}, opts...)...) // a test's own sleep wins
	run := &phase.Run[int, int]{Lease: lease, Retried: func(step string, try int, _ error, wait time.Duration) {
		require.Equal(t, "call", step)
		require.Equal(t, len(reported)+1, try)
		reported = append(reported, wait)
	}}
	err = seam.StepOf(step).RunForeign(ctx, run)
	return calls, w.all(), reported, err
}

var errBusy = errors.New("busy")

func failing(context.Context, int) error { return errBusy }

// Retry{} means three tries, waits from RetryBaseDefault; each retry is
// reported with the wait slept. (Mutation caught: defaults not filled.)
func TestRetryDefaults(t *testing.T) {
	t.Parallel()
	calls, slept, reported, err := tries(t, context.Background(), time.Minute, failing, foreign.Retry{})
	require.ErrorIs(t, err, errBusy)
	require.Equal(t, foreign.RetryMaxDefault, calls)
	require.Equal(t, []time.Duration{foreign.RetryBaseDefault, 2 * foreign.RetryBaseDefault}, slept)
	require.Equal(t, slept, reported)

	calls, _, _, err = tries(t, context.Background(), time.Minute, failing)
	require.ErrorIs(t, err, errBusy)
	require.Equal(t, 1, calls, "without Retry, one try")
}

// With Jitter, each wait is drawn between zero and the backoff: over 99
// waits of a 1ms backoff, all lie within it and not all are equal to it.
// (Mutation caught: Jitter ignored.)
func TestRetryJitterIsFull(t *testing.T) {
	t.Parallel()
	calls, slept, _, _ := tries(t, context.Background(), time.Minute, failing,
		foreign.Retry{Max: foreign.RetryMaxLimit, Base: time.Millisecond, Cap: time.Millisecond, Jitter: true})
	require.Equal(t, foreign.RetryMaxLimit, calls)
	require.Len(t, slept, foreign.RetryMaxLimit-1)
	below := 0
	for _, d := range slept {
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.LessOrEqual(t, d, time.Millisecond)
		if d < time.Millisecond {
			below++
		}
	}
	require.NotZero(t, below)
}

// A backoff longer than a third of the lease is cut to it rather than
// deferred: only the other system's Retry-After defers; with no lease
// known nothing defers.
// (Mutation caught: backoff not cut to the lease.)
func TestRetryBackoffStaysWithinTheLease(t *testing.T) {
	t.Parallel()
	calls, slept, _, err := tries(t, context.Background(), 30*time.Second, failing,
		foreign.Retry{Max: 2, Base: 20 * time.Second})
	require.ErrorIs(t, err, errBusy)
	require.Equal(t, 2, calls)
	require.Equal(t, []time.Duration{10 * time.Second}, slept)

	asksAnHour := func(context.Context, int) error { return &foreign.HTTPError{Status: 503, RetryAfter: time.Hour} }
	_, slept, _, _ = tries(t, context.Background(), 0, asksAnHour, foreign.Retry{Max: 2})
	require.Equal(t, []time.Duration{time.Hour}, slept)
}

// The end of the attempt's context stops the tries: during a wait (the
// error says both), or during a try. (Mutations caught: a wait that
// ignores its context's end; a try failed by the attempt's end retried.)
func TestRetryStopsWhenTheAttemptEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	calls, _, _, err := tries(t, ctx, time.Minute, failing,
		foreign.Retry{Max: 3}, foreign.WithSleep(func(ctx context.Context, _ time.Duration) error {
			cancel()
			return ctx.Err()
		}))
	require.ErrorIs(t, err, errBusy)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, calls)

	ctx, cancel = context.WithCancel(context.Background())
	calls, slept, _, err := tries(t, ctx, time.Minute, func(ctx context.Context, _ int) error {
		cancel()
		return ctx.Err()
	}, foreign.Retry{Max: 3})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, calls)
	require.Empty(t, slept)
}

// The wait between tries ends when the attempt's context does: an hour's
// backoff, cancelled as it starts, returns at once. (Mutation caught: a
// wait deaf to its context.)
func TestRetryWaitEndsWithTheAttempt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	step := foreign.Mutation("call", func(context.Context, *foreign.Call[int, int]) error { return errBusy },
		foreign.Retry{Max: 2, Base: time.Hour})
	run := &phase.Run[int, int]{Retried: func(string, int, error, time.Duration) { cancel() }}
	done := make(chan error, 1)
	go func() { done <- seam.StepOf(step).RunForeign(ctx, run) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, errBusy)
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(time.Minute): // a bound on a hang, not a measurement
		t.Fatal("the wait outlived the attempt's context")
	}
}

// A per-try timeout ends each try's context, not the attempt's: the next
// try gets a fresh one. (Mutation caught: one timeout for all the tries.)
func TestTimeoutIsPerTry(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a bound, if each try's is not
	defer cancel()
	calls, _, _, err := tries(t, ctx, time.Minute, func(ctx context.Context, call int) error {
		if call == 1 {
			<-ctx.Done()
			return ctx.Err()
		}
		return ctx.Err()
	}, foreign.Retry{Max: 2}, foreign.Timeout(time.Millisecond))
	require.NoError(t, err)
	require.Equal(t, 2, calls)
}

// Options out of range panic where the workflow is declared.
func TestMutationOptionsOutOfRange(t *testing.T) {
	t.Parallel()
	fn := func(context.Context, *foreign.Call[int, int]) error { return nil }
	for _, opt := range []func() foreign.Option{
		func() foreign.Option { return foreign.Retry{Max: -1} },
		func() foreign.Option { return foreign.Retry{Max: foreign.RetryMaxLimit + 1} },
		func() foreign.Option { return foreign.Retry{Base: -time.Second} },
		func() foreign.Option { return foreign.Retry{Base: time.Second, Cap: time.Millisecond} },
		func() foreign.Option { return foreign.Timeout(0) },
		func() foreign.Option { return foreign.Timeout(-time.Second) },
	} {
		require.Panics(t, func() { foreign.Mutation("call", fn, opt()) })
	}
	require.NotPanics(t, func() { foreign.Mutation("call", fn, foreign.Retry{Max: foreign.RetryMaxLimit}) })
}
