package foreign

import (
	"cmp"
	"context"
	"time"

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
}

// KeyFor derives a further downstream key for one of several calls the
// step makes, such as one per item in a loop: the same parts always give the
// same key within this step of this record.
func (c *Call[Req, State]) KeyFor(parts ...string) string {
	return DeriveKey(c.Run.Key, c.Run.RecordID, keyStep(c.Run), parts...)
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
// the same c.Key), a Timeout per try, and a Limit that paces the tries. Mutation panics on an option out
// of range, as workflow.Define panics on a broken definition.
func Mutation[Req, State any](name string, fn func(ctx context.Context, c *Call[Req, State]) error, opts ...Option) phase.Step[Req, State] {
	o := newOptions(name, opts)
	return phase.Foreign(name, func(ctx context.Context, r *phase.Run[Req, State]) error {
		c := &Call[Req, State]{Run: r, Key: DeriveKey(r.Key, r.RecordID, keyStep(r))}
		var retried func(int, error, time.Duration)
		if r.Retried != nil {
			retried = func(try int, err error, wait time.Duration) { r.Retried(r.Step, try, err, wait) }
		}
		t := tries{lease: r.Lease, retried: retried, pacer: r.Pacer, tenant: r.Key.Tenant}
		return o.run(ctx, t, func(ctx context.Context) error { return fn(ctx, c) })
	})
}

// Permanent marks err as permanent (phase.Permanent): no retry can fix it
// (the other system refused the request as invalid, a card was declined).
// A Retry stops at it, and the engine fails the workflow at once.
// Permanent(nil) is nil.
func Permanent(err error) error { return phase.Permanent(err) }
