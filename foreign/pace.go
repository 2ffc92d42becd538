package foreign

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
)

// Bounds of a Pace.
const (
	// PaceConcurrencyLimit is the most concurrent calls a Pace may allow.
	PaceConcurrencyLimit = 10_000
	// PaceRateLimit is the highest Rate a Pace may ask for, per second.
	PaceRateLimit = 1_000_000
	// PaceRateMin is the lowest Rate above 0 a Pace may ask for, per
	// second: one call a day. A lower one waits longer for a token than a
	// deferral lasts (recovery.MaxDefer), and the database's arithmetic
	// underflows near zero.
	PaceRateMin = 1.0 / (24 * 60 * 60)
	// PaceBurstLimit is the largest Burst a Pace may ask for.
	PaceBurstLimit = 1_000_000
)

// ErrInvalidPace reports a Pace, or a downstream's name, out of range.
var ErrInvalidPace = errors.New("foreign: invalid pace")

// ErrUnknownDownstream reports a Mutation declared with Limit(downstream)
// run by an engine that has no Pace for that downstream: its call is not
// made.
var ErrUnknownDownstream = errors.New("foreign: no pace is configured for the downstream")

// Pace limits the calls to one downstream (a payment provider, say) made by
// every step declared with Limit of its name, in every process that shares
// the database: a step waits for its turn outside any transaction, holding
// no connection. The zero Pace limits nothing but still honours the
// circuit: a call answered 429 with a Retry-After holds back every call to
// the downstream until then.
//
// The rate is a token bucket kept in the database: Burst calls may start at
// once after a quiet time, Rate per second on average. A downstream that
// counts calls per window of w seconds sees at most
// Burst + Rate·w + Concurrency calls starting in it, whatever the callers'
// delays: configure Rate and Burst below its limit by that much.
type Pace struct {
	// Concurrency is how many calls may run at once. 0 means no limit.
	// At most PaceConcurrencyLimit.
	Concurrency int
	// Rate is how many calls may start per second on average. 0 means no
	// limit. At least PaceRateMin (one a day), at most PaceRateLimit.
	Rate float64
	// Burst is how many calls may start at once after a quiet time, with
	// Rate. 0 means 1. At most PaceBurstLimit.
	Burst int
	// PerTenant applies the limits to each tenant's calls apart, and so
	// does the circuit; by default they apply to all tenants together.
	PerTenant bool
}

// validate reports a field of p out of range.
func (p Pace) validate() error {
	switch {
	case p.Concurrency < 0 || p.Concurrency > PaceConcurrencyLimit:
		return fmt.Errorf("pace: Concurrency is %d; want 0 to %d", p.Concurrency, PaceConcurrencyLimit)
	case math.IsNaN(p.Rate) || p.Rate < 0 || p.Rate > PaceRateLimit || (p.Rate > 0 && p.Rate < PaceRateMin):
		return fmt.Errorf("pace: Rate is %v; want 0, or %g to %d per second", p.Rate, PaceRateMin, PaceRateLimit)
	case p.Burst < 0 || p.Burst > PaceBurstLimit:
		return fmt.Errorf("pace: Burst is %d; want 0 to %d", p.Burst, PaceBurstLimit)
	case p.Burst > 0 && p.Rate == 0:
		return errors.New("pace: Burst is set without a Rate")
	}
	return nil
}

// bucket is p's rate and burst as the token bucket statement takes them: a
// Pace without a rate gets one no call can exhaust.
func (p Pace) bucket() (rate, burst float64) {
	if p.Rate == 0 {
		return unlimitedRate, unlimitedRate
	}
	return p.Rate, float64(max(p.Burst, 1))
}

// unlimitedRate is the rate and burst of a Pace without a Rate.
const unlimitedRate = 1e12

// Limit paces the Mutation's calls to downstream, a name the engine has a
// Pace for (workflow.Config Pacing): each try takes a slot and a token of
// that Pace before it calls, waiting outside any transaction, and gives the
// slot back when it returns. A try answered 429 with a Retry-After (an
// *HTTPError, see CheckResponse) opens the downstream's circuit for that
// long, so that other keys wait, or defer, instead of each calling into the
// refusal. A wait longer than a third of the engine's lease defers the key
// (phase.Defer) instead of holding it idle. An engine without a Pace for
// downstream fails the step with ErrUnknownDownstream, calling nothing.
// Limit panics on a name that is empty or longer than 255 bytes.
func Limit(downstream string) Option {
	if err := recovery.CheckName("downstream", downstream); err != nil {
		panic(fmt.Sprintf("foreign: Limit(%q): %v", downstream, err))
	}
	return limitOption(downstream)
}

type limitOption string

func (l limitOption) apply(o *options) { o.downstream = string(l) }

// WaitError is why a paced call did not start: the wait for its turn was
// longer than a third of the lease, so the step defers (a *phase.DeferError
// wraps it). The engine counts no attempt for a deferral that waited only
// for its turn (not Circuit), since nothing was called; after a failed try
// of the same attempt, the deferral wraps that try's error instead, and
// counts.
type WaitError struct {
	// Downstream is the Pace's name; Tenant is set when it is per tenant.
	Downstream, Tenant string
	// Circuit reports an open circuit (a 429 asked for the wait); else the
	// wait is for a slot or a token.
	Circuit bool
	// Wait is the time until the call could start, as far as it is known.
	Wait time.Duration
}

// Error says what the call waits for.
func (e *WaitError) Error() string {
	what := "its turn"
	if e.Circuit {
		what = "the circuit to close"
	}
	return fmt.Sprintf("call to %s waits %s for %s", e.Downstream, e.Wait.Round(time.Millisecond), what)
}

// deferFor returns the deferral of a call that cannot start within limit.
func deferFor(downstream, scope string, circuit bool, wait time.Duration) error {
	return phase.Defer(wait, &WaitError{Downstream: downstream, Tenant: scope, Circuit: circuit, Wait: wait})
}

// circuitAnswer is how long the answer err asks every call to downstream
// to wait: the Retry-After of a 429, or 0.
func circuitAnswer(err error) time.Duration {
	var h *HTTPError
	if errors.As(err, &h) && h.Status == 429 {
		return h.RetryAfter
	}
	return 0
}
