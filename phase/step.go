package phase

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/recovery"
)

// Kind is what a step does.
type Kind int

const (
	// KindAtomic: local writes in one transaction, committed with the
	// recovery point.
	KindAtomic Kind = iota + 1
	// KindForeign: a call to another system, outside any transaction.
	KindForeign
)

// String returns "atomic" or "foreign".
func (k Kind) String() string {
	switch k {
	case KindAtomic:
		return "atomic"
	case KindForeign:
		return "foreign"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// MarshalText encodes k as "atomic" or "foreign", the form exported
// workflow definitions carry.
func (k Kind) MarshalText() ([]byte, error) {
	if k != KindAtomic && k != KindForeign {
		return nil, fmt.Errorf("phase: no text for %v", k)
	}
	return []byte(k.String()), nil
}

// UnmarshalText decodes "atomic" or "foreign".
func (k *Kind) UnmarshalText(text []byte) error {
	switch string(text) {
	case "atomic":
		*k = KindAtomic
	case "foreign":
		*k = KindForeign
	default:
		return fmt.Errorf("phase: %q is not a step kind (atomic or foreign)", text)
	}
	return nil
}

// Run is what a step function sees of the workflow it belongs to.
type Run[Req, State any] struct {
	// Key is the idempotency key the workflow runs under.
	Key recovery.Key
	// RecordID is the key record's id: minted once, the same for every
	// attempt, different if the key is reused after its record was pruned.
	RecordID uuid.UUID
	// KeysFromClientKey, set by the engine (workflow.Config.DeriveKeysFrom),
	// makes downstream keys (foreign.Mutation) derive from Key alone rather
	// than from Key and RecordID.
	KeysFromClientKey bool
	// Step is the name of the step being run.
	Step string
	// KeyStep is the name downstream keys derive from (foreign.Mutation):
	// the step's name, or, for a step the workflow declares renamed
	// (workflow.Renamed), its first name, so that a call made before the
	// rename is made again with the same key. "" means Step.
	KeyStep string
	// Attempt counts the attempts at this workflow, this one included.
	Attempt int
	// Lease is the engine's lease: a step waiting longer than a third of it
	// between tries of a call had better Defer than hold the key idle.
	Lease time.Duration
	// Retried, set by the engine, hears of each retry of a call within the
	// step (foreign.Retry): the step, the try that failed (from 1), its
	// error, and the wait before the next. The engine logs and counts it.
	// nil hears nothing.
	Retried func(step string, try int, err error, wait time.Duration)
	// Pacer, set by the engine, paces the calls of steps declared with
	// foreign.Limit. nil when the engine paces nothing.
	Pacer Pacer
	// Request is the workflow's request. Treat it as read-only.
	Request Req
	// State is the workflow state. Steps change it; it is committed as JSON
	// with each recovery point.
	State State
}

// AtomicFunc makes a step's local writes in tx. It must not commit or roll
// back tx.
type AtomicFunc[Req, State any] func(ctx context.Context, tx pgx.Tx, r *Run[Req, State]) error

// ForeignFunc calls another system.
type ForeignFunc[Req, State any] func(ctx context.Context, r *Run[Req, State]) error

// Step is one named step of a workflow.
type Step[Req, State any] struct {
	name    string
	kind    Kind
	atomic  AtomicFunc[Req, State]
	foreign ForeignFunc[Req, State]
	undo    ForeignFunc[Req, State]
}

// Atomic declares an atomic phase: fn's writes in tx commit together with
// the recovery point, or not at all.
func Atomic[Req, State any](name string, fn AtomicFunc[Req, State]) Step[Req, State] {
	return Step[Req, State]{name: name, kind: KindAtomic, atomic: fn}
}

// Foreign declares a step that calls another system outside any
// transaction. Most code uses foreign.Mutation, which hands the call a
// downstream idempotency key derived from the record.
func Foreign[Req, State any](name string, fn ForeignFunc[Req, State]) Step[Req, State] {
	return Step[Req, State]{name: name, kind: KindForeign, foreign: fn}
}

// Compensate returns the step with fn as its compensation: the call that
// undoes what the step did, for a workflow that fails terminally before its
// point of no return (see workflow.Abort). Only a foreign step has one. The
// engine runs it as a durable step of its own: it may run more than once,
// so it must be idempotent, and it must treat "nothing to undo" as done.
// Most code uses foreign.Compensate, which hands fn a downstream key of its
// own.
func (s Step[Req, State]) Compensate(fn ForeignFunc[Req, State]) Step[Req, State] {
	s.undo = fn
	return s
}

// Compensable reports whether the step has a compensation.
func (s Step[Req, State]) Compensable() bool { return s.undo != nil }

// Name returns the step's name, which is also its recovery point.
func (s Step[Req, State]) Name() string { return s.name }

// Kind returns what the step does.
func (s Step[Req, State]) Kind() Kind { return s.kind }

// valid reports what is wrong with the step's declaration, if anything.
func (s Step[Req, State]) valid() error {
	if err := recovery.CheckName("step name", s.name); err != nil {
		return err
	}
	if (s.kind == KindAtomic && s.atomic == nil) || (s.kind == KindForeign && s.foreign == nil) || s.kind == 0 {
		return fmt.Errorf("step %q has no function", s.name)
	}
	if s.undo != nil && s.kind != KindForeign {
		return fmt.Errorf("step %q is %v: only a foreign step has a compensation", s.name, s.kind)
	}
	return nil
}

// runAtomic runs an atomic step's function in tx. A panic in the function
// is returned as a *PanicError.
func (s Step[Req, State]) runAtomic(ctx context.Context, tx pgx.Tx, r *Run[Req, State]) (err error) {
	defer recoverPanic(s.name, &err)
	r.Step = s.name
	return s.atomic(ctx, tx, r)
}

// runForeign runs a foreign step's function. A panic in the function is
// returned as a *PanicError.
func (s Step[Req, State]) runForeign(ctx context.Context, r *Run[Req, State]) (err error) {
	defer recoverPanic(s.name, &err)
	r.Step = s.name
	return s.foreign(ctx, r)
}

// runCompensation runs a foreign step's compensation. A panic in it is
// returned as a *PanicError.
func (s Step[Req, State]) runCompensation(ctx context.Context, r *Run[Req, State]) (err error) {
	defer recoverPanic(s.name+" (compensation)", &err)
	r.Step = s.name
	return s.undo(ctx, r)
}

// PanicError is a panic recovered from a step, with the stack where it
// happened.
type PanicError struct {
	Step  string
	Value any
	Stack []byte
}

// Error names the step and the panic's value.
func (e *PanicError) Error() string { return fmt.Sprintf("step %s panicked: %v", e.Step, e.Value) }

// Unwrap returns the panic's value when it is an error, so that errors.Is
// sees through a panic(err).
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

func recoverPanic(step string, err *error) {
	if v := recover(); v != nil {
		*err = &PanicError{Step: step, Value: v, Stack: debug.Stack()}
	}
}
