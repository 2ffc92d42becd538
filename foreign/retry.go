package foreign

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/onceflow/onceflow/internal/sleep"
	"github.com/onceflow/onceflow/phase"
)

// Defaults and bounds of a Retry policy.
const (
	// RetryMaxDefault is how many tries a Retry with Max 0 makes.
	RetryMaxDefault = 3
	// RetryMaxLimit is the most tries a Retry may ask for.
	RetryMaxLimit = 100
	// RetryBaseDefault is the wait before the second try of a Retry with
	// Base 0.
	RetryBaseDefault = 100 * time.Millisecond
	// RetryCapDefault is the longest wait between tries of a Retry with
	// Cap 0.
	RetryCapDefault = 10 * time.Second
)

// Option configures a Mutation: a Retry policy, a Timeout per try, or a
// compensation (Compensate).
type Option interface {
	apply(o *options)
}

// Retry retries a foreign mutation's function within the attempt when it
// fails transiently, under the attempt's lease (the engine's heartbeat
// keeps it) and with the same derived key every time, so the other system
// deduplicates the tries. Every error is transient except:
//
//   - an error marked Permanent (CheckResponse marks a 4xx answer so): the
//     step fails at once;
//   - the end of the attempt's context (the caller went away, the lease was
//     lost): the step stops;
//   - a workflow outcome (workflow.Respond, workflow.Reject) or a
//     phase.DeferError the function returns: they end the step as they
//     would without Retry;
//   - ErrUnknownDownstream (a Limit the engine has no Pace for): no try
//     can change the engine's configuration.
//
// Before try n+1 it waits the backoff, Base·2^(n-1) but at most Cap (with
// Jitter, a random wait between zero and that: "full jitter", so that the
// many callers of a recovering system do not come back together), and at
// least the Retry-After of an *HTTPError. A wait longer than a third of the
// engine's lease (phase.Run.Lease) would hold the key idle: when the other
// system asked for it (Retry-After), the step returns phase.Defer instead,
// and the engine hands the key back until then; a backoff alone is cut to
// that third. After Max tries the last error is the step's, and the
// attempt fails as any attempt does (it counts against MaxAttempts),
// unless it asked for more than that third: the step defers then too.
//
// Without a Retry option a Mutation tries once per attempt (and defers as
// above when that try's answer asks for a long Retry-After).
type Retry struct {
	// Max is how many tries one attempt makes, the first included. 0 means
	// RetryMaxDefault; 1 means no retry. At most RetryMaxLimit.
	Max int
	// Base is the wait before the second try, doubled before each further
	// one. 0 means RetryBaseDefault.
	Base time.Duration
	// Cap is the longest wait between tries. 0 means RetryCapDefault, or
	// Base when Base is longer.
	Cap time.Duration
	// Jitter waits a random time between zero and the backoff instead of
	// the backoff itself. Set it unless you have a reason not to.
	Jitter bool
}

func (r Retry) apply(o *options) { o.retry = r }

// withDefaults returns r with each zero field set to its default.
func (r Retry) withDefaults() Retry {
	r.Max = cmp.Or(r.Max, RetryMaxDefault)
	r.Base = cmp.Or(r.Base, RetryBaseDefault)
	r.Cap = cmp.Or(r.Cap, max(RetryCapDefault, r.Base))
	return r
}

// validate reports a field of r, with its defaults filled in, out of range.
func (r Retry) validate() error {
	switch {
	case r.Max < 1 || r.Max > RetryMaxLimit:
		return fmt.Errorf("foreign: Retry.Max is %d; want 1 to %d (0: %d)", r.Max, RetryMaxLimit, RetryMaxDefault)
	case r.Base < 0:
		return fmt.Errorf("foreign: Retry.Base is %s", r.Base)
	case r.Cap < r.Base:
		return fmt.Errorf("foreign: Retry.Cap (%s) is shorter than Base (%s)", r.Cap, r.Base)
	}
	return nil
}

// backoff is the wait after the try-th failed try, before jitter.
func (r Retry) backoff(try int) time.Duration {
	wait := r.Base
	for i := 1; i < try; i++ {
		if wait > r.Cap/2 {
			return r.Cap
		}
		wait *= 2
	}
	return min(wait, r.Cap)
}

// Timeout bounds each try of a Mutation's function: its context ends d
// after the try started (and, as always, when the attempt's does). A try
// cut by it failed transiently: with Retry, the next try follows. It
// panics unless d is positive.
func Timeout(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("foreign: Timeout(%s): want a positive duration", d))
	}
	return timeoutOption(d)
}

type timeoutOption time.Duration

func (t timeoutOption) apply(o *options) { o.timeout = time.Duration(t) }

// options are a Mutation's settings.
type options struct {
	retry   Retry         // with its defaults filled in
	timeout time.Duration // 0: none
	undo    any           // a compensation[Req, State], or nil
	// downstream is the Pace the calls go through (Limit); "": none.
	downstream string
	// sleep waits d or until ctx ends; tests replace it (export_test.go).
	sleep func(ctx context.Context, d time.Duration) error
}

// newOptions applies opts, fills in defaults, and panics on a setting out
// of range: a Mutation is declared with its workflow, at start-up, where a
// broken declaration is a programming error best found at once.
func newOptions(name string, opts []Option) options {
	o := options{retry: Retry{Max: 1}, sleep: sleep.For} // without Retry, one try
	for _, opt := range opts {
		opt.apply(&o)
	}
	o.retry = o.retry.withDefaults()
	if err := o.retry.validate(); err != nil {
		panic(fmt.Sprintf("step %s: %v", name, err))
	}
	return o
}

// final is an error that is an answer, not a failure: the workflow
// package's Respond and Reject. No try can change it.
type final interface{ Final() bool }

// retryable reports whether a try that failed with err may be followed by
// another: see Retry.
func retryable(ctx context.Context, err error) bool {
	var (
		deferred *phase.DeferError
		answer   final
	)
	switch {
	case ctx.Err() != nil, phase.IsPermanent(err), errors.As(err, &deferred), errors.Is(err, ErrUnknownDownstream):
		return false
	case errors.As(err, &answer) && answer.Final():
		return false
	}
	return true
}

// run calls try until it succeeds, fails for good, or o's tries are spent,
// waiting between tries as Retry says, each try paced by t's pacer when o
// has a Limit. t.lease is the engine's lease (0: none known, so nothing
// defers); t.retried, if set, hears of each retry before its wait.
func (o *options) run(ctx context.Context, t tries, try func(ctx context.Context) error) error {
	lease, retried := t.lease, t.retried
	limit := time.Duration(math.MaxInt64) // the longest wait that holds the key: none known without a lease
	if lease > 0 {
		limit = lease / 3
	}
	var failed error // the last try's error
	for n := 1; ; n++ {
		err := o.paced(ctx, t, try)
		if failed != nil {
			err = afterFailure(err, failed)
		}
		if err == nil || !retryable(ctx, err) {
			return err
		}
		failed = err
		// The other system's Retry-After beyond the limit defers, on the
		// last try too: failing instead would hand the key back for an
		// at-once takeover that calls again long before the time asked.
		asked := retryAfter(err)
		if asked > limit {
			return phase.Defer(asked, err)
		}
		if n >= o.retry.Max {
			return err
		}
		backoff := o.backoff(n, limit)
		wait := max(backoff, asked)
		if retried != nil {
			retried(n, err, wait)
		}
		if stopped := o.sleep(ctx, wait); stopped != nil {
			return fmt.Errorf("%w (stopped before try %d: %w)", err, n+1, stopped)
		}
	}
}

// afterFailure is err, the outcome of a try that followed one that failed
// with failed, as the engine must count it: a deferral that waited for its
// turn spends no attempt (nothing was called), but after a failed try it
// must, or a downstream that always fails would be called for ever.
func afterFailure(err, failed error) error {
	var (
		d *phase.DeferError
		w *WaitError
	)
	if errors.As(err, &d) && errors.As(err, &w) && !w.Circuit {
		return phase.Defer(d.After, fmt.Errorf("%w (and then: %v)", failed, err))
	}
	return err
}

// tries is what run needs of the attempt.
type tries struct {
	lease   time.Duration
	retried func(try int, err error, wait time.Duration)
	pacer   phase.Pacer
	tenant  string
}

// paced runs one try through t's pacer when o has a Limit: every try takes
// its own turn.
func (o *options) paced(ctx context.Context, t tries, try func(ctx context.Context) error) error {
	if o.downstream == "" {
		return o.once(ctx, try)
	}
	if t.pacer == nil {
		return fmt.Errorf("%w: %q (the engine paces nothing: workflow.Config Pacing)", ErrUnknownDownstream, o.downstream)
	}
	return t.pacer.Pace(ctx, o.downstream, t.tenant, t.lease, func(ctx context.Context) error { return o.once(ctx, try) })
}

// once runs one try, under the per-try timeout if there is one.
func (o *options) once(ctx context.Context, try func(ctx context.Context) error) error {
	if o.timeout == 0 {
		return try(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	return try(ctx)
}

// backoff is the wait after the n-th try failed, at most limit, jittered
// if so asked: drawn below the wait that is slept, so that a Cap beyond
// limit does not turn nearly every draw into limit.
func (o *options) backoff(n int, limit time.Duration) time.Duration {
	wait := min(o.retry.backoff(n), limit)
	if o.retry.Jitter {
		wait = time.Duration(rand.N(uint64(wait) + 1)) // uint64: no overflow at math.MaxInt64
	}
	return wait
}

// retryAfter is the Retry-After of the *HTTPError in err, or 0.
func retryAfter(err error) time.Duration {
	var h *HTTPError
	if errors.As(err, &h) {
		return h.RetryAfter
	}
	return 0
}
