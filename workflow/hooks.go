package workflow

import (
	"context"
	"fmt"
	"time"

	"github.com/onceflow/onceflow/phase"
)

// PointKind is where in a workflow a crash point lies.
type PointKind int

const (
	// BeforeStep: before the step starts (for the first atomic phase of a
	// fresh run, before the claim).
	BeforeStep PointKind = iota + 1
	// AfterForeignCall: a foreign mutation returned, its result not yet
	// committed.
	AfterForeignCall
	// AfterCommit: the step's commit succeeded, the caller not yet told.
	AfterCommit
	// BeforeCommit: an atomic phase's writes and recovery point are made,
	// its transaction not yet committed. This point alone comes with the
	// transaction open: a hook that returns an error there has it rolled
	// back, as a process death would; a hook that blocks there holds its
	// locks, the key's row among them.
	BeforeCommit
	// BeforeCompensation: a record is compensating, and the compensation
	// of the step is about to run.
	BeforeCompensation
	// AfterCompensationCall: the step's compensation returned, its
	// result not yet committed.
	AfterCompensationCall
	// AfterCompensationCommit: the step's compensation is committed (the
	// last one's commit finished the record), the caller not yet told.
	AfterCompensationCommit
)

// CrashPoint is a place where a process could die with interesting
// consequences.
type CrashPoint struct {
	Kind PointKind
	Step string
}

// String describes the point, e.g. "after charge's call".
func (p CrashPoint) String() string {
	switch p.Kind {
	case BeforeStep:
		return "before " + p.Step
	case AfterForeignCall:
		return "after " + p.Step + "'s call"
	case AfterCommit:
		return "after " + p.Step + "'s commit"
	case BeforeCommit:
		return "before " + p.Step + "'s commit"
	case BeforeCompensation:
		return "before undoing " + p.Step
	case AfterCompensationCall:
		return "after " + p.Step + "'s compensation call"
	case AfterCompensationCommit:
		return "after " + p.Step + "'s compensation commit"
	}
	return fmt.Sprintf("CrashPoint(%d, %s)", p.Kind, p.Step)
}

// Hooks observe and interrupt attempts, for tests.
type Hooks struct {
	// CrashPoint is called at every crash point an attempt passes; only
	// BeforeCommit comes with a transaction open. If it returns an error,
	// the attempt stops there as a process death would: an open
	// transaction rolls back, and there is no lease release, no cleanup, no
	// further write; Run returns an error matching ErrCrashed. To test an
	// attempt that stalls and wakes up after its lease was taken over,
	// block in the hook (at any point but BeforeCommit) and return nil:
	// every write it tries afterwards is fenced out.
	CrashPoint func(ctx context.Context, key Key, p CrashPoint) error

	// LeaseRenewed is called after each heartbeat renewal, with the new
	// lease end, or with the error that stopped it.
	LeaseRenewed func(key Key, step string, until time.Time, err error)

	// SavingDefinition is called before each try to store a definition
	// (see Engine.SaveDefinitions), with the try's context. A hook that
	// blocks delays the save, as a slow server would; an error fails the
	// try, as the server's would.
	SavingDefinition func(ctx context.Context, workflow, version string) error
}

// CrashPoints lists, from a workflow's definition, every crash point a run
// from the first step passes, in order: before each step, after each foreign
// call, before each atomic phase's commit, and after each commit.
func CrashPoints(d Definition) []CrashPoint {
	steps := d.Steps()
	var points []CrashPoint
	for i, s := range steps {
		points = append(points, CrashPoint{BeforeStep, s.Name})
		if s.Kind == phase.KindForeign {
			points = append(points, CrashPoint{AfterForeignCall, s.Name})
		}
		if s.Kind == phase.KindAtomic {
			points = append(points, CrashPoint{BeforeCommit, s.Name})
		}
		// A foreign result followed by an atomic phase commits with it.
		if s.Kind == phase.KindAtomic || i == len(steps)-1 || steps[i+1].Kind == phase.KindForeign {
			points = append(points, CrashPoint{AfterCommit, s.Name})
		}
	}
	return points
}

// CompensationPoints lists, from a workflow's definition, the crash points
// a record compensating every step that has a compensation passes, in
// order: before each compensation, after its call, and after its commit,
// latest step first. A run that succeeds passes none of them; CrashPoints
// lists those.
func CompensationPoints(d Definition) []CrashPoint {
	defs := d.versions()
	names := defs[len(defs)-1].compensable()
	var points []CrashPoint
	for i := len(names) - 1; i >= 0; i-- {
		points = append(points, CrashPoint{BeforeCompensation, names[i]}, CrashPoint{AfterCompensationCall, names[i]},
			CrashPoint{AfterCompensationCommit, names[i]})
	}
	return points
}

// crashPoint runs the CrashPoint hook, if any.
func (e *Engine) crashPoint(ctx context.Context, key Key, kind PointKind, step string) error {
	if e.hooks.CrashPoint == nil {
		return nil
	}
	p := CrashPoint{Kind: kind, Step: step}
	if err := e.hooks.CrashPoint(ctx, key, p); err != nil {
		return fmt.Errorf("%w %s: %w", ErrCrashed, p, err)
	}
	return nil
}
