package workflow

import (
	"errors"
	"time"

	"github.com/onceflow/onceflow/recovery"
)

// Claim outcomes as an Observer hears them.
const (
	ClaimNew      = "new"
	ClaimTakeover = "takeover"
	ClaimReplay   = "replay"
	ClaimConflict = "conflict" // in flight elsewhere
	ClaimMismatch = "mismatch"
	// ClaimForbidden: the key's record belongs to another principal.
	ClaimForbidden = "forbidden"
	// ClaimParked: the key's record is parked for an operator.
	ClaimParked = "parked"
)

// Observer is told what the engine does, for metrics (see package metrics).
// Its methods must be quick and safe for concurrent use. Later releases
// may add methods: embed NopObserver in an Observer of your own, and it
// keeps compiling, ignoring what it does not implement.
type Observer interface {
	// Claimed reports how a run found its key: ClaimNew, ClaimTakeover,
	// ClaimReplay, ClaimConflict, ClaimMismatch or ClaimForbidden.
	Claimed(workflow, outcome string)
	// StepFinished reports how long a step's function took and its error.
	StepFinished(workflow, step string, took time.Duration, err error)
	// LeaseLost reports an attempt that found its key taken over.
	LeaseLost(workflow string)
	// Parked reports a record parked because the running definition may
	// not resume it (or cannot decode its request or state).
	Parked(workflow string)
	// StepRetried reports a call that a step retries within its attempt
	// (foreign.Retry), once per retry.
	StepRetried(workflow, step string)
	// StepDeferred reports an attempt that handed its key back until a time
	// the other system asked for (phase.DeferError).
	StepDeferred(workflow, step string)
	// Compensated reports a compensation's call (foreign.Compensate) and
	// its error; nil means the step's effect is undone.
	Compensated(workflow, step string, err error)
	// PaceWaited reports a call that waited for its turn (foreign.Limit)
	// before it started, and how long.
	PaceWaited(downstream string, waited time.Duration)
	// PaceDeferred reports a call that deferred its key because its turn
	// was too far off (foreign.WaitError).
	PaceDeferred(downstream string)
	// CircuitOpened reports an answer (a 429 with Retry-After) that held
	// back every call to downstream for open.
	CircuitOpened(downstream string, open time.Duration)
}

// claimOutcome names the outcome of a claim for an Observer; "" for errors
// that are not outcomes (invalid input, an unreachable database).
func claimOutcome(outcome recovery.Outcome, err error) string {
	switch {
	case errors.Is(err, ErrInFlight):
		return ClaimConflict
	case errors.Is(err, ErrMismatch):
		return ClaimMismatch
	case errors.Is(err, ErrForbidden):
		return ClaimForbidden
	case errors.Is(err, ErrParked):
		return ClaimParked
	case err != nil:
		return ""
	}
	return outcome.String()
}

func (e *Engine) observeClaim(workflow string, outcome recovery.Outcome, err error) {
	if e.observer == nil {
		return
	}
	if name := claimOutcome(outcome, err); name != "" {
		e.observer.Claimed(workflow, name)
	}
}

func (e *Engine) observeStep(workflow, step string, started time.Time, err error) {
	if e.observer != nil {
		e.observer.StepFinished(workflow, step, e.now().Sub(started), err)
	}
}

func (e *Engine) observeLeaseLost(workflow string) {
	if e.observer != nil {
		e.observer.LeaseLost(workflow)
	}
}

func (e *Engine) observeParked(workflow string) {
	if e.observer != nil {
		e.observer.Parked(workflow)
	}
}

func (e *Engine) observeRetry(workflow, step string) {
	if e.observer != nil {
		e.observer.StepRetried(workflow, step)
	}
}

func (e *Engine) observeDeferred(workflow, step string) {
	if e.observer != nil {
		e.observer.StepDeferred(workflow, step)
	}
}

func (e *Engine) observeCompensation(workflow, step string, started time.Time, err error) {
	if e.observer != nil {
		e.observer.StepFinished(workflow, step+" (compensation)", e.now().Sub(started), err)
		e.observer.Compensated(workflow, step, err)
	}
}

// NopObserver ignores everything. Embed it in an Observer that implements
// only the methods it cares about.
type NopObserver struct{}

// Claimed does nothing.
func (NopObserver) Claimed(string, string) {}

// StepFinished does nothing.
func (NopObserver) StepFinished(string, string, time.Duration, error) {}

// LeaseLost does nothing.
func (NopObserver) LeaseLost(string) {}

// Parked does nothing.
func (NopObserver) Parked(string) {}

// StepRetried does nothing.
func (NopObserver) StepRetried(string, string) {}

// StepDeferred does nothing.
func (NopObserver) StepDeferred(string, string) {}

// Compensated does nothing.
func (NopObserver) Compensated(string, string, error) {}

// PaceWaited does nothing.
func (NopObserver) PaceWaited(string, time.Duration) {}

// PaceDeferred does nothing.
func (NopObserver) PaceDeferred(string) {}

// CircuitOpened does nothing.
func (NopObserver) CircuitOpened(string, time.Duration) {}

var _ Observer = NopObserver{}
