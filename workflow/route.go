package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/onceflow/onceflow/recovery"
)

// ErrParked: the key's record was written by a definition the running one
// cannot resume; it waits for an operator (HTTP 503, Retry-After).
// errors.As gives a *recovery.ParkedError with the reason.
var ErrParked = recovery.ErrParked

// ErrNotParked: ResumeAs found a record that is not parked.
var ErrNotParked = errors.New("idempotency key is not parked")

// maxHops bounds how often an attempt hands a record to another registered
// version: once, since the version it hands to is the record's own.
const maxHops = 1

// route is how an attempt runs the record it claimed.
type route struct {
	// other: another registered version is the record's; it runs it.
	other runnable
	// upgrade: another definition wrote the record, and this one resumes
	// it, after point (the recovery point in this definition's names).
	// from is that definition, when it is known.
	upgrade bool
	from    *Spec
	point   string
	// restamp: the record is this definition's under its legacy
	// fingerprint; stamp it with the fingerprint.
	restamp bool
	// park: why this definition may not run the record ("" when it may).
	park string
}

// route decides how definition w runs rec, a record it just claimed. It
// reads stored definitions through s, the claiming attempt's store: in the
// claim's transaction when the claim is in one, so that an attempt holds
// one connection at a time (a pool whose connections all hold claims
// waiting for another would wait for ever).
func (e *Engine) route(ctx context.Context, s *recovery.Store, w runnable, rec *recovery.Record) (route, error) {
	cur := w.spec()
	if rec.ResumeAs != "" {
		return e.routeResumeAs(ctx, s, w, rec)
	}
	switch {
	case rec.Definition == "":
		// Claimed before definitions were stored: resume as before, at
		// the recovery point's name in this definition.
		return route{point: cur.renamedTo(rec.RecoveryPoint)}, nil
	case rec.Definition == cur.Fingerprint:
		return route{point: rec.RecoveryPoint}, nil
	case cur.is(rec.Definition):
		// Stamped by an earlier release of onceflow with this definition
		// as far as that release could tell (Spec.Earlier): what it would
		// have undone is unknown, and taken as this one's. Restamped, the
		// record is compared with this one's from now on.
		return route{point: rec.RecoveryPoint, restamp: true}, nil
	}
	if d, ok := e.definitionFor(rec); ok && d.spec().is(rec.Definition) {
		return route{other: d}, nil
	}
	old, err := e.storedSpec(ctx, s, rec.Workflow, rec.Definition)
	var unreadable *unreadableSpecError
	switch {
	case errors.As(err, &unreadable):
		return route{park: fmt.Sprintf("%v; running version %s", err, cur.Version)}, nil
	case err != nil:
		return route{}, err
	case old == nil:
		return route{park: fmt.Sprintf("the definition that wrote the record (fingerprint %s) is neither registered nor stored; running version %s",
			rec.Definition, cur.Version)}, nil
	}
	point, why := resumeAt(*old, rec.RecoveryPoint, cur)
	if why != "" {
		return route{park: fmt.Sprintf("written by version %s, running version %s: %s", old.Version, cur.Version, why)}, nil
	}
	return route{upgrade: true, from: old, point: point}, nil
}

// routeResumeAs routes a record an operator resumed as a definition of
// their choice (Engine.ResumeAs, onceflow keys resume --as): that
// definition runs it from its recovery point (renamed as it declares),
// without comparing definitions. A process that does not register it parks
// the record again rather than guess.
func (e *Engine) routeResumeAs(ctx context.Context, s *recovery.Store, w runnable, rec *recovery.Record) (route, error) {
	if !w.spec().is(rec.ResumeAs) {
		if d, ok := e.definitionFor(rec); ok && d.spec().is(rec.ResumeAs) {
			return route{other: d}, nil
		}
		return route{park: fmt.Sprintf("an operator resumed it as definition %s, which this process does not register (running version %s)",
			rec.ResumeAs, w.spec().Version)}, nil
	}
	r := route{point: w.spec().renamedTo(rec.RecoveryPoint), upgrade: !w.spec().is(rec.Definition)}
	if r.upgrade && rec.Definition != "" {
		// Only to name the version that wrote the record: the operator
		// vouched for the rest, so an unreadable one does not matter.
		old, err := e.storedSpec(ctx, s, rec.Workflow, rec.Definition)
		var unreadable *unreadableSpecError
		if err != nil && !errors.As(err, &unreadable) {
			return route{}, err
		}
		r.from = old
	}
	return r, nil
}

// unreadableSpecError reports a stored definition that cannot be compared
// with: it does not decode (a step kind this build does not know), or is not
// the definition it is stored as.
type unreadableSpecError struct {
	workflow, fingerprint, why string
}

func (e *unreadableSpecError) Error() string {
	return fmt.Sprintf("the stored definition that wrote the record (fingerprint %s of %s) is unreadable: %s",
		e.fingerprint, e.workflow, e.why)
}

// storedSpec returns the stored definition of workflow with fingerprint,
// read through s, nil when none is stored, and an *unreadableSpecError when the one stored
// cannot be used.
func (e *Engine) storedSpec(ctx context.Context, s *recovery.Store, workflow, fingerprint string) (*Spec, error) {
	cacheKey := workflow + "\x00" + fingerprint
	e.mu.RLock()
	sp, ok := e.specs[cacheKey]
	e.mu.RUnlock()
	if ok {
		return sp, nil
	}
	defs, err := s.Definitions(ctx, workflow, fingerprint)
	if err != nil || len(defs) == 0 {
		return nil, err
	}
	sp = new(Spec)
	if err := json.Unmarshal(defs[0].Spec, sp); err != nil {
		return nil, &unreadableSpecError{workflow: workflow, fingerprint: fingerprint, why: err.Error()}
	}
	if sp.Workflow != workflow || sp.Fingerprint != fingerprint || len(sp.Steps) == 0 {
		return nil, &unreadableSpecError{workflow: workflow, fingerprint: fingerprint,
			why: fmt.Sprintf("it names workflow %q, fingerprint %q and %d steps", sp.Workflow, sp.Fingerprint, len(sp.Steps))}
	}
	e.mu.Lock()
	e.specs[cacheKey] = sp
	e.mu.Unlock()
	return sp, nil
}

// ResumeAs resolves a parked record: it runs the record under the
// registered definition of its workflow whose version (or fingerprint) is
// version, from its recovery point, without comparing definitions. The
// operator vouches that version can continue what the record's definition
// started. The record's recovery point must be a step of that version, or
// one it declares renamed. The
// change is fenced by the record's owner token as read: of two operators,
// one wins, and the other gets ErrLeaseLost. `onceflow keys resume --as`
// does the same from the command line, for whichever process runs the
// record next.
func (e *Engine) ResumeAs(ctx context.Context, key Key, version string) (*Result, error) {
	rec, err := e.store.Load(ctx, key)
	if err != nil {
		return nil, err
	}
	if rec.Status != recovery.StatusParked {
		return nil, fmt.Errorf("resume key %q of tenant %q as %s: %w (status %s)", key.ID, key.Tenant, version, ErrNotParked, rec.Status)
	}
	d, err := e.version(rec.Workflow, version)
	if err != nil {
		return nil, err
	}
	sp := d.spec()
	if rec.RecoveryPoint != "" && !sp.hasStep(sp.renamedTo(rec.RecoveryPoint)) {
		return nil, fmt.Errorf("%w: resume key %q as version %s of %s: its recovery point %q is not a step of that version",
			ErrInvalidInput, key.ID, sp.Version, sp.Workflow, rec.RecoveryPoint)
	}
	if err := e.store.Unpark(ctx, rec.Fence(), sp.Fingerprint, "resumed by an operator as version "+sp.Version); err != nil {
		return nil, err
	}
	e.logger.InfoContext(ctx, "parked record resumed by an operator", "workflow", rec.Workflow, "tenant", key.Tenant, "key", key.ID,
		"version", sp.Version)
	return e.Resume(ctx, key)
}

// version returns the registered definition of workflow whose version
// label or fingerprint is version.
func (e *Engine) version(workflow, version string) (runnable, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	fam, ok := e.workflows[workflow]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownWorkflow, workflow)
	}
	var known []string
	for _, d := range fam.byFP {
		sp := d.spec()
		if sp.Version == version || sp.is(version) {
			return d, nil
		}
		known = append(known, sp.Version)
	}
	return nil, fmt.Errorf("%w: workflow %s has no registered version %q (registered: %s)",
		ErrUnknownWorkflow, workflow, version, strings.Join(known, ", "))
}
