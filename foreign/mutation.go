package foreign

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/tracing"
	"github.com/onceflow/onceflow/phase"
)

// Call is what a foreign mutation's function sees: the workflow run (its
// request and state) and the downstream key for this step.
type Call[Req, State any] struct {
	*phase.Run[Req, State]
	// Key is this step's downstream idempotency key. Send it with the call;
	// every attempt at this step sends the same key. (It shadows Run.Key,
	// the client's key, which is c.Run.Key.)
	Key string
	// Compensates is, in a compensation (Compensate), the downstream key
	// the step's own call was made with: what to undo. Key is then the
	// compensation's own key. "" in the step itself.
	Compensates string
}

// KeyFor derives a further downstream key for one of several calls the
// step makes, such as one per item in a loop: the same parts always give the
// same key within this step of this record.
func (c *Call[Req, State]) KeyFor(parts ...string) string {
	return DeriveKey(c.Run.Key, keyRecord(c.Run), keyStep(c.Run), parts...)
}

// keyStep is the step name r's downstream keys derive from.
func keyStep[Req, State any](r *phase.Run[Req, State]) string { return cmp.Or(r.KeyStep, r.Step) }

// Mutation declares a step that changes another system. fn runs outside any
// transaction with c.Key derived for it; what fn puts in c.State is
// committed at the next commit point. If the process dies before then, the
// step runs again with the same key, and the other system must deduplicate
// it: send c.Key.
//
// opts may add a Retry policy (tries within the attempt, every one with
// the same c.Key), a Timeout per try, a Limit that paces the tries, and a
// compensation (Compensate), which runs under the same Retry, Timeout and
// Limit. Mutation panics on an option out of range, or a compensation of
// other Req and State types, as workflow.Define panics on a broken
// definition.
func Mutation[Req, State any](name string, fn func(ctx context.Context, c *Call[Req, State]) error, opts ...Option) phase.Step[Req, State] {
	o := newOptions(name, opts)
	step := phase.Foreign(name, wrap(&o, fn, false))
	if o.undo != nil {
		undo, ok := o.undo.(compensation[Req, State])
		if !ok {
			panic(fmt.Sprintf("step %s: its compensation takes a %T, not a *foreign.Call[%T, %T]", name, o.undo, *new(Req), *new(State)))
		}
		step = step.Compensate(wrap(&o, undo, true))
	}
	return step
}

// compensateKeyPart is what a compensation's key derives from, after the
// step's name: c.KeyFor("compensate") of the step itself.
const compensateKeyPart = "compensate"

// wrap makes fn a phase function that tries it as o says, with the Call
// of the step, or, for a compensation, the Call with the compensation's
// key.
func wrap[Req, State any](o *options, fn func(ctx context.Context, c *Call[Req, State]) error, compensation bool) phase.ForeignFunc[Req, State] {
	return func(ctx context.Context, r *phase.Run[Req, State]) error {
		c := &Call[Req, State]{Run: r, Key: DeriveKey(r.Key, keyRecord(r), keyStep(r))}
		if compensation {
			c.Compensates, c.Key = c.Key, c.KeyFor(compensateKeyPart)
		}
		var retried func(int, error, time.Duration)
		if r.Retried != nil {
			retried = func(try int, err error, wait time.Duration) { r.Retried(r.Step, try, err, wait) }
		}
		t := tries{lease: r.Lease, retried: retried, pacer: r.Pacer, tenant: r.Key.Tenant}
		try := 0
		return o.run(ctx, t, func(ctx context.Context) (err error) {
			try++
			ctx, span := startCall(ctx, c, try)
			defer func() { tracing.End(span, err) }()
			return fn(ctx, c)
		})
	}
}

// startCall starts the span of one try of c's call, from the tracer of
// the span ctx carries (the engine's step span, made by the engine's
// TracerProvider): a child of the step, with the derived key and, in a
// compensation, the key it undoes. Nothing of the request goes in.
func startCall[Req, State any](ctx context.Context, c *Call[Req, State], try int) (context.Context, trace.Span) {
	ctx, span := trace.SpanFromContext(ctx).TracerProvider().Tracer(tracing.ScopeName).
		Start(ctx, "onceflow.call "+c.Step)
	if span.IsRecording() {
		span.SetAttributes(tracing.Step.String(c.Step), tracing.DerivedKey.String(c.Key), tracing.Try.Int(try))
		if c.Compensates != "" {
			span.SetAttributes(tracing.Compensates.String(c.Compensates))
		}
	}
	return ctx, span
}

// compensation is a Compensate option's function.
type compensation[Req, State any] func(ctx context.Context, c *Call[Req, State]) error

func (f compensation[Req, State]) apply(o *options) { o.undo = f }

// Compensate declares how to undo a Mutation: fn calls the other system to
// reverse what the step's call did (a refund for a charge). The engine runs
// it when the workflow fails terminally before its point of no return
// (workflow.Abort, a Permanent error, MaxAttempts), as a durable step of
// its own: a process that dies during it leaves the record compensating,
// and the next attempt runs it again. So, like the step, it must be
// idempotent: c.Key is its own downstream key (the step's
// KeyFor("compensate"), the same on every run), and c.Compensates the key
// the step's call was made with, which names what to undo. The call may
// never have reached the other system (the step timed out), or may reach it
// only later: fn must treat "nothing to undo" as done, and the other system
// should refuse a call whose undo it has already seen. A Permanent error
// from fn leaves the record failed, for an operator.
func Compensate[Req, State any](fn func(ctx context.Context, c *Call[Req, State]) error) Option {
	if fn == nil {
		panic("foreign: Compensate(nil)")
	}
	return compensation[Req, State](fn)
}

// Permanent marks err as permanent (phase.Permanent): no retry can fix it
// (the other system refused the request as invalid, a card was declined).
// A Retry stops at it, and the engine fails the workflow at once.
// Permanent(nil) is nil.
func Permanent(err error) error { return phase.Permanent(err) }
