package workflow

import (
	"context"
	"fmt"

	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
)

// Key identifies one intent: an idempotency key within a tenant.
type Key = recovery.Key

// Definition is a declared workflow, whatever its request and state types.
// Workflow[Req, State] is the only implementation.
type Definition interface {
	// Name is the workflow's name, stored with each key record.
	Name() string
	// Steps lists the steps in order.
	Steps() []StepInfo

	resume(ctx context.Context, e *Engine, rec *recovery.Record) (*Result, error)
}

// StepInfo describes one step of a definition.
type StepInfo struct {
	Name string
	Kind phase.Kind
}

// Workflow is a declared sequence of steps over a request of type Req and a
// state of type State. Both must survive a JSON round trip: the request is
// stored when the key is claimed and the state at every commit.
type Workflow[Req, State any] struct {
	name   string
	steps  []phase.Step[Req, State]
	finish func(*State) Response
}

// Define declares a workflow. It panics if the definition is invalid (no
// steps, a name or step name breaking the input rules, two steps with one
// name): definitions are package-level values, and a broken one is a
// programming error best found at start-up.
func Define[Req, State any](name string, steps ...phase.Step[Req, State]) *Workflow[Req, State] {
	w := &Workflow[Req, State]{name: name, steps: steps}
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

// Name returns the workflow's name.
func (w *Workflow[Req, State]) Name() string { return w.name }

// Steps lists the workflow's steps in order.
func (w *Workflow[Req, State]) Steps() []StepInfo {
	infos := make([]StepInfo, len(w.steps))
	for i, s := range w.steps {
		infos[i] = StepInfo{Name: s.Name(), Kind: s.Kind()}
	}
	return infos
}

// response builds the final response from s.
func (w *Workflow[Req, State]) response(s *State) Response {
	if w.finish == nil {
		return JSON(200, s)
	}
	return w.finish(s)
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
