package workflow

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
)

// Key identifies one intent: an idempotency key within a tenant.
type Key = recovery.Key

// Definition is a declared workflow, whatever its request and state types:
// a *Workflow[Req, State], or several versions of one (Versions).
type Definition interface {
	// Name is the workflow's name, stored with each key record.
	Name() string
	// Steps lists the steps in order (of the latest version).
	Steps() []StepInfo
	// Spec returns the definition as data (of the latest version).
	Spec() Spec

	// versions lists the definitions it holds, oldest first.
	versions() []runnable
}

// runnable is one definition the engine can run: a *Workflow[Req, State].
type runnable interface {
	Definition
	spec() Spec
	compensable() []string
	resume(ctx context.Context, e *Engine, rec *recovery.Record, hops int) (*Result, error)
}

// Workflow is a declared sequence of steps over a request of type Req and a
// state of type State. Both must survive a JSON round trip: the request is
// stored when the key is claimed and the state at every commit.
type Workflow[Req, State any] struct {
	name   string
	steps  []phase.Step[Req, State]
	finish func(*State) Response

	version      string
	renamed      map[string]string // earlier name → name now
	removed      []string
	upgradeState func(old json.RawMessage) (State, error)
	specOnce     atomic.Pointer[Spec] // spec, computed once the definition is complete
	// noReturn is the index of the step after which nothing is undone;
	// -1 when no point of no return is declared (everything may be).
	noReturn int
}

// Define declares a workflow. It panics if the definition is invalid (no
// steps, a name or step name breaking the input rules, two steps with one
// name, more than recovery.MaxUndo steps with a compensation):
// definitions are package-level values, and a broken one is a
// programming error best found at start-up.
func Define[Req, State any](name string, steps ...phase.Step[Req, State]) *Workflow[Req, State] {
	w := &Workflow[Req, State]{name: name, steps: steps, noReturn: -1}
	if err := w.validate(); err != nil {
		panic(err)
	}
	return w
}

func (w *Workflow[Req, State]) validate() error {
	if err := recovery.CheckName("workflow", w.name); err != nil {
		return err
	}
	if len(w.steps) == 0 {
		return fmt.Errorf("%w: workflow %s has no steps", ErrInvalidInput, w.name)
	}
	if n := len(w.compensable()); n > recovery.MaxUndo {
		// More could never be listed to undo: each failure would fail to
		// start compensating, and be retried for ever.
		return fmt.Errorf("%w: workflow %s has %d steps with a compensation; at most %d (recovery.MaxUndo)",
			ErrInvalidInput, w.name, n, recovery.MaxUndo)
	}
	seen := map[string]bool{}
	for _, s := range w.steps {
		if err := seam.StepOf(s).Valid(); err != nil {
			return fmt.Errorf("workflow %s: %w", w.name, err)
		}
		if seen[s.Name()] {
			return fmt.Errorf("%w: workflow %s has two steps named %q", ErrInvalidInput, w.name, s.Name())
		}
		seen[s.Name()] = true
	}
	return nil
}

// Finish sets how the response is built from the final state. Without it,
// the response is 200 with the state as JSON.
func (w *Workflow[Req, State]) Finish(fn func(*State) Response) *Workflow[Req, State] {
	w.finish = fn
	return w
}

// PointOfNoReturn declares that once step afterStep has committed (a
// foreign step: once its call may have been made, since its result commits
// only with the next commit), a terminal failure no longer undoes
// anything: before it, a workflow that
// fails for good (Abort, a phase.Permanent error, MaxAttempts) runs the
// compensations (foreign.Compensate) of its started foreign steps; after
// it, the failure is stored as it is and the record ends failed, for an
// operator. Put it after the step that makes undoing wrong (the order was
// paid and shipped). Without it, every step may be undone. It panics when
// the workflow has no step afterStep.
//
// The point of no return, like which steps have a compensation, is part of
// the definition (Spec.Compensation, and its fingerprint): a deploy that
// moves it past a record in flight that had passed it, or before one that
// had not, parks the record instead of undoing what the old definition
// declared final, or keeping what it would undo (see Resumable).
func (w *Workflow[Req, State]) PointOfNoReturn(afterStep string) *Workflow[Req, State] {
	i, ok := w.indexOf(afterStep)
	if !ok {
		panic(fmt.Errorf("%w: workflow %s: PointOfNoReturn(%q): no such step", ErrInvalidInput, w.name, afterStep))
	}
	w.noReturn = i
	w.specOnce.Store(nil)
	return w
}

// undo lists the steps to compensate when the workflow fails for good at
// the step at index failing, in the order their compensations run: every
// compensable step up to failing, latest first, failing itself included
// unless refused (its own error or Abort said it did nothing). None after
// the point of no return.
func (w *Workflow[Req, State]) undo(failing int, refused bool) []string {
	if w.pastNoReturn(failing, refused) {
		return nil
	}
	var undo []string
	for i := min(failing, len(w.steps)-1); i >= 0; i-- {
		if (i < failing || !refused) && w.steps[i].Compensable() {
			undo = append(undo, w.steps[i].Name())
		}
	}
	return undo
}

// pastNoReturn reports whether a workflow that fails for good at the step
// at index failing (refused: that step's own error or Abort says it did
// nothing) is past its point of no return: the step after which nothing
// is undone has committed, or, being a foreign step, may have made its
// call (its result commits only with the step after it). It is the rule
// Spec.pastNoReturn applies to a stored definition.
func (w *Workflow[Req, State]) pastNoReturn(failing int, refused bool) bool {
	switch {
	case w.noReturn < 0:
		return false
	case failing > w.noReturn:
		return true
	}
	return failing == w.noReturn && w.steps[failing].Kind() == phase.KindForeign && !refused
}

// compensable lists the steps with a compensation, in order.
func (w *Workflow[Req, State]) compensable() []string {
	var names []string
	for _, s := range w.steps {
		if s.Compensable() {
			names = append(names, s.Name())
		}
	}
	return names
}

// Name returns the workflow's name.
func (w *Workflow[Req, State]) Name() string { return w.name }

// Steps lists the workflow's steps in order.
func (w *Workflow[Req, State]) Steps() []StepInfo {
	infos := make([]StepInfo, len(w.steps))
	for i, s := range w.steps {
		infos[i] = StepInfo{Name: s.Name(), Kind: s.Kind()}
		if first := firstName(w.renamed, s.Name()); first != s.Name() {
			infos[i].Key = first
		}
	}
	return infos
}

func (w *Workflow[Req, State]) versions() []runnable { return []runnable{w} }

// response builds the final response from s.
func (w *Workflow[Req, State]) response(s *State) Response {
	if w.finish == nil {
		return JSON(200, s)
	}
	return w.finish(s)
}

// indexOf returns the index of the step named step.
func (w *Workflow[Req, State]) indexOf(step string) (int, bool) {
	i := slices.IndexFunc(w.steps, func(s phase.Step[Req, State]) bool { return s.Name() == step })
	return i, i >= 0
}

// indexAfter returns the index of the step after recovery point point, 0
// for none, and false when the point names no step of this workflow.
func (w *Workflow[Req, State]) indexAfter(point string) (int, bool) {
	if point == "" {
		return 0, true
	}
	for i, s := range w.steps {
		if s.Name() == point {
			return i + 1, true
		}
	}
	return 0, false
}

// VersionSet is several versions of one workflow, registered together (see
// Versions).
type VersionSet struct {
	defs []runnable
}

// Versions keeps earlier definitions of a workflow registered next to the
// current one, the last: a record resumes under the definition that wrote
// it (the engine picks it by the fingerprint the record stores), while new
// records use the current one. Register the result (Config.Workflows,
// Engine.Register). Drop a version once no record it wrote is in flight
// (onceflow keys list --status in_flight). It panics when the definitions
// are not all of one workflow, or two have one fingerprint.
func Versions(defs ...Definition) *VersionSet {
	vs := &VersionSet{}
	seen := map[string]bool{}
	for _, d := range defs {
		for _, r := range d.versions() {
			sp := r.spec()
			if len(vs.defs) > 0 && sp.Workflow != vs.defs[0].Name() {
				panic(fmt.Errorf("%w: Versions of %s and %s: the definitions must be of one workflow", ErrInvalidInput, vs.defs[0].Name(), sp.Workflow))
			}
			if seen[sp.Fingerprint] {
				panic(fmt.Errorf("%w: Versions of %s: two definitions are version %s", ErrInvalidInput, sp.Workflow, sp.Version))
			}
			seen[sp.Fingerprint] = true
			vs.defs = append(vs.defs, r)
		}
	}
	if len(vs.defs) == 0 {
		panic(fmt.Errorf("%w: Versions of no definition", ErrInvalidInput))
	}
	return vs
}

func (vs *VersionSet) current() runnable { return vs.defs[len(vs.defs)-1] }

// Name returns the workflow's name.
func (vs *VersionSet) Name() string { return vs.current().Name() }

// Steps lists the current version's steps.
func (vs *VersionSet) Steps() []StepInfo { return vs.current().Steps() }

// Spec returns the current version as data.
func (vs *VersionSet) Spec() Spec { return vs.current().Spec() }

// Specs returns every version as data, oldest first: what `workflows
// export` writes.
func (vs *VersionSet) Specs() []Spec {
	specs := make([]Spec, len(vs.defs))
	for i, d := range vs.defs {
		specs[i] = d.spec()
	}
	return specs
}

func (vs *VersionSet) versions() []runnable { return vs.defs }
