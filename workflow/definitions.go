package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/recovery"
)

// A definition is stored (onceflow_definitions) before it claims or takes
// over a key, so that a process running another definition can read it to
// decide whether it may resume the records it wrote or restamped. The
// engine stores each definition once, in the background, as soon as it is
// registered (NewEngine's Config.Workflows, Register, a workflow's first
// Run): off any caller's clock, so that a slow save fails no request. A
// run that comes first waits for the save, bounded by its own context and
// not by Config.DBTimeout, which bounds its claim.

// saveTries is how many times a save of a definition is tried before the
// runs waiting for it get its error; the next run starts another save.
const saveTries = 3

// saveTryTimeout bounds one try to store a definition: a statement that
// inserts one row at most, which no working server takes this long for,
// however loaded.
const saveTryTimeout = 30 * time.Second

// saveBackoff is the pause after a failed try, doubled after each.
const saveBackoff = 200 * time.Millisecond

// definitionSave is a save of a definition, under way or ended.
type definitionSave struct {
	done chan struct{} // closed when the save ended
	err  error         // why it failed, once done; nil when stored
}

// failed reports whether the save ended without storing the definition.
func (s *definitionSave) failed() bool {
	select {
	case <-s.done:
		return s.err != nil
	default:
		return false
	}
}

// saveLocked returns the save of d's definition: the one under way, or
// done, or a new one it starts when there was none or the last failed.
// e.mu must be held for writing.
func (e *Engine) saveLocked(d runnable) *definitionSave {
	sp := d.spec()
	if s := e.saves[sp.Fingerprint]; s != nil && !s.failed() {
		return s
	}
	s := &definitionSave{done: make(chan struct{})}
	e.saves[sp.Fingerprint] = s
	go e.saveDefinition(sp, s)
	return s
}

// ensureSaved returns once w's definition is stored, starting its save if
// none is under way, or ctx ended.
func (e *Engine) ensureSaved(ctx context.Context, w runnable) error {
	e.mu.RLock()
	s := e.saves[w.spec().Fingerprint]
	e.mu.RUnlock()
	if s == nil || s.failed() {
		e.mu.Lock()
		s = e.saveLocked(w)
		e.mu.Unlock()
	}
	select {
	case <-s.done:
		return s.err
	case <-ctx.Done():
		return fmt.Errorf("waiting for the definition of %s to be stored: %w", w.spec().Workflow, context.Cause(ctx))
	}
}

// saveDefinition stores sp, trying again after a failure, and ends s with
// the outcome. Not being migrated is not tried again.
func (e *Engine) saveDefinition(sp Spec, s *definitionSave) {
	defer close(s.done)
	body, err := json.Marshal(sp)
	if err != nil {
		s.err = fmt.Errorf("encode definition of %s: %w", sp.Workflow, err)
		e.logger.Error("cannot store a workflow definition", "workflow", sp.Workflow, "version", sp.Version, "error", s.err)
		return
	}
	pause := saveBackoff
	for try := 1; ; try++ {
		err := e.saveOnce(sp, body)
		if err == nil {
			return
		}
		attrs := []any{slog.String("workflow", sp.Workflow), slog.String("version", sp.Version), slog.Int("try", try), slog.Any("error", err)}
		if try == saveTries || errors.Is(err, ErrNotMigrated) {
			s.err = err
			e.logger.Error("could not store a workflow definition; its runs fail until the next one stores it", attrs...)
			return
		}
		wait := pause + rand.N(pause/2) // jittered: processes started together do not try together
		e.logger.Warn("storing a workflow definition failed; trying again", append(attrs, slog.Duration("pause", wait))...)
		time.Sleep(wait)
		pause *= 2
	}
}

// saveOnce tries once to store sp, encoded as body.
func (e *Engine) saveOnce(sp Spec, body []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), saveTryTimeout)
	defer cancel()
	if e.hooks.SavingDefinition != nil {
		if err := e.hooks.SavingDefinition(ctx, sp.Workflow, sp.Version); err != nil {
			return err
		}
	}
	err := seam.StoreOf(e.store).SaveDefinition(ctx, recovery.StoredDefinition{
		Workflow: sp.Workflow, Fingerprint: sp.Fingerprint, Version: sp.Version, Spec: body})
	if err != nil && ctx.Err() != nil && !errors.Is(err, ErrNotMigrated) {
		err = fmt.Errorf("%w: store definition of %s: no answer within %s: %w", ErrUnavailable, sp.Workflow, saveTryTimeout, err)
	}
	return err
}

// SaveDefinitions returns once every registered definition is stored, or
// ctx ended. The engine stores each definition in the background as soon
// as it is registered, trying three times (each try bounded by 30s, each
// failure logged), and a run waits for its own definition, bounded by its
// context but not by Config.DBTimeout. Call SaveDefinitions at start-up
// to learn at once that the database is unreachable or not migrated. It
// starts a new save of a definition whose save failed.
func (e *Engine) SaveDefinitions(ctx context.Context) error {
	e.mu.RLock()
	var defs []runnable
	for _, fam := range e.workflows {
		for _, d := range fam.byFP {
			defs = append(defs, d)
		}
	}
	e.mu.RUnlock()
	for _, d := range defs {
		if err := e.ensureSaved(ctx, d); err != nil {
			return err
		}
	}
	return nil
}
