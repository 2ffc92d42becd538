package workflow

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
)

// fingerprintLength is how many bytes of SHA-256 a definition's fingerprint
// keeps, in hex: collisions among one workflow's definitions are out of
// reach.
const fingerprintLength = 16

// shortFingerprint is how many hex digits of a fingerprint label a
// definition without an explicit version.
const shortFingerprint = 12

// Spec is a workflow definition as data: what a record's definition is
// compared with, what the database keeps of every definition that claimed
// a key, and what `onceflow workflows export` writes and `onceflow
// workflows diff` reads.
type Spec struct {
	Workflow string `json:"workflow"`
	// Version is the definition's label: its explicit version
	// (Workflow.Version), or the first 12 hex digits of its fingerprint.
	Version string `json:"version"`
	// Fingerprint identifies the definition: a hash of its name, its
	// explicit version, its steps' names and kinds in order (and a renamed
	// step's first name), its state's JSON shape, and what it undoes
	// (Compensation).
	Fingerprint string     `json:"fingerprint"`
	Steps       []StepInfo `json:"steps"`
	// Renamed maps a step's earlier name to its name in this definition
	// (Workflow.Changes with Renamed).
	Renamed map[string]string `json:"renamed,omitempty"`
	// Removed lists steps earlier definitions had and this one dropped
	// (Workflow.Changes with Removed).
	Removed []string `json:"removed,omitempty"`
	// State is a hash of the JSON shape of the definition's state type
	// (its field names and their types), part of the fingerprint: a state
	// whose shape changed makes another definition.
	State string `json:"state_shape,omitempty"`
	// UpgradesState says the definition reads other definitions' states
	// through a state upgrader (Workflow.UpgradeState).
	UpgradesState bool `json:"upgrades_state,omitempty"`
	// Compensation is what the definition undoes when a record fails for
	// good. nil in a definition stored or exported by a release of
	// onceflow from before it was recorded: unknown, and then not compared
	// (Resumable).
	Compensation *Compensation `json:"compensation,omitempty"`
	// Earlier is the fingerprint and state shape that releases of onceflow
	// before this one gave the definition: they hashed neither what it
	// undoes (Compensation) nor the kind of each number in its state
	// (every integer kind was "integer", every float "number", a []byte an
	// array of integers). A record stamped with Earlier.Fingerprint is this
	// definition's own: it resumes as such, and is stamped with Fingerprint
	// then, so the upgrade changes no record's definition. nil in a
	// definition stored or exported by such a release.
	Earlier *Earlier `json:"earlier,omitempty"`
}

// Compensation is what a definition undoes when a record fails for good:
// before its point of no return, the compensations of the started steps
// that have one (foreign.Compensate).
type Compensation struct {
	// Steps lists the steps with a compensation, in order.
	Steps []string `json:"steps,omitempty"`
	// NoReturnAfter is the step after which nothing is undone
	// (Workflow.PointOfNoReturn); "" when every step may be.
	NoReturnAfter string `json:"no_return_after,omitempty"`
}

// Earlier is a definition's fingerprint and state shape as releases before
// Spec.Earlier computed them.
type Earlier struct {
	Fingerprint string `json:"fingerprint"`
	State       string `json:"state_shape"`
}

// is reports whether a record stamped with fingerprint fp is this
// definition's: fp is its fingerprint, or the one an earlier release of
// onceflow gave it (Earlier).
func (s Spec) is(fp string) bool {
	return fp != "" && (fp == s.Fingerprint || (s.Earlier != nil && fp == s.Earlier.Fingerprint))
}

// sameState reports whether definitions a and b have one state shape,
// comparing a shape an earlier release computed (Earlier) with the same
// computation of the other's. Either unknown ("") counts as the same.
func sameState(a, b Spec) bool {
	if a.State == "" || b.State == "" || a.State == b.State {
		return true
	}
	return (a.Earlier != nil && a.Earlier.State == b.State) || (b.Earlier != nil && b.Earlier.State == a.State)
}

// StepInfo describes one step of a definition.
type StepInfo struct {
	Name string     `json:"name"`
	Kind phase.Kind `json:"kind"`
	// Key is the name the step's downstream keys derive from when it is
	// not Name: the first name of a step declared renamed (Renamed).
	Key string `json:"key,omitempty"`
}

// keyName is the name the step's downstream keys derive from.
func (st StepInfo) keyName() string { return cmp.Or(st.Key, st.Name) }

// Change is a declared difference between a definition and the ones before
// it, so that records they wrote can be resumed by it: see Renamed and
// Removed.
type Change struct {
	renamedFrom, renamedTo string
	removed                string
}

// Renamed declares that step to was called from in earlier definitions. A
// record whose recovery point is at or after from resumes at to, and to
// keeps deriving its downstream keys from from (phase.Run.KeyStep), so that
// a call that may have been made under the old name is made again with the
// same key: its own key, the keys foreign.Call.KeyFor derives, and its
// compensation's key and the key that compensation undoes. The declaration is part of the definition's fingerprint: records
// made since the rename derive their keys from from too, so a definition
// that drops it parks those that may have started the call. After a second
// rename, declare the chain (Renamed("a", "b"), Renamed("b", "c")); two
// renames to one step are refused.
func Renamed(from, to string) Change { return Change{renamedFrom: from, renamedTo: to} }

// Removed declares that earlier definitions had step, and its effect is no
// longer wanted. A record resumes without it when it had not started:
// when it lies after the recovery point and is not a foreign call that may
// have been made before a crash. A record that completed it, or may have
// started it, is parked.
func Removed(step string) Change { return Change{removed: step} }

// Version gives the definition an explicit version, its label in logs,
// parked records and `onceflow keys resume --as`. It is part of the
// fingerprint. Call it (and Changes, UpgradeState) where the workflow is
// defined, before it runs.
func (w *Workflow[Req, State]) Version(version string) *Workflow[Req, State] {
	if version != "" {
		if err := checkVersion(version); err != nil {
			panic(fmt.Errorf("workflow %s: %w", w.name, err))
		}
	}
	w.version = version
	w.specOnce.Store(nil)
	return w
}

// Changes declares how the definition differs from earlier ones (Renamed,
// Removed), so that records they wrote resume under it instead of being
// parked. It panics when a change contradicts the steps: a rename to a step
// the workflow does not have, or from or of a step it still has.
func (w *Workflow[Req, State]) Changes(changes ...Change) *Workflow[Req, State] {
	for _, c := range changes {
		if c.removed != "" {
			w.removed = append(w.removed, c.removed)
			continue
		}
		if w.renamed == nil {
			w.renamed = map[string]string{}
		}
		w.renamed[c.renamedFrom] = c.renamedTo
	}
	w.specOnce.Store(nil)
	if err := w.spec().validChanges(); err != nil {
		panic(fmt.Errorf("workflow %s: %w", w.name, err))
	}
	return w
}

// UpgradeState sets how a state committed by an earlier definition is read
// when a record resumes under this one: fn gets the stored JSON and returns
// the state in this definition's shape. Without it the stored JSON is
// decoded into State as it is. fn runs only for records written by another
// definition; the state it returns is committed before any step runs.
func (w *Workflow[Req, State]) UpgradeState(fn func(old json.RawMessage) (State, error)) *Workflow[Req, State] {
	w.upgradeState = fn
	w.specOnce.Store(nil)
	return w
}

// Spec returns the definition as data.
func (w *Workflow[Req, State]) Spec() Spec {
	s := w.spec()
	s.Steps = slices.Clone(s.Steps)
	s.Removed = slices.Clone(s.Removed)
	s.Renamed = maps.Clone(s.Renamed)
	if s.Compensation != nil {
		c := *s.Compensation
		c.Steps = slices.Clone(c.Steps)
		s.Compensation = &c
	}
	if s.Earlier != nil {
		earlier := *s.Earlier
		s.Earlier = &earlier
	}
	return s
}

// spec returns the definition as data, computed once; the engine only
// reads it.
func (w *Workflow[Req, State]) spec() Spec {
	if s := w.specOnce.Load(); s != nil {
		return *s
	}
	s := w.computeSpec()
	w.specOnce.Store(&s)
	return s
}

func (w *Workflow[Req, State]) computeSpec() Spec {
	s := Spec{Workflow: w.name, Steps: w.Steps(), Removed: slices.Clone(w.removed),
		State: stateShape(reflect.TypeFor[State]()), UpgradesState: w.upgradeState != nil,
		Compensation: &Compensation{Steps: w.compensable()}}
	if w.noReturn >= 0 {
		s.Compensation.NoReturnAfter = w.steps[w.noReturn].Name()
	}
	s.Renamed = maps.Clone(w.renamed)
	earlier := earlierStateShape(reflect.TypeFor[State]())
	s.Fingerprint = s.hash(w.version, true, s.State)
	s.Earlier = &Earlier{Fingerprint: s.hash(w.version, false, earlier), State: earlier}
	s.Version = w.version
	if s.Version == "" {
		s.Version = s.Fingerprint[:shortFingerprint]
	}
	return s
}

// hash returns the fingerprint of s, whose explicit version is version,
// with state as its state shape: with what it undoes (s.Compensation) when
// undo is set, or as releases before Spec.Earlier made it.
func (s Spec) hash(version string, undo bool, state string) string {
	h := sha256.New()
	write := func(v string) {
		h.Write(binary.AppendUvarint(nil, uint64(len(v))))
		h.Write([]byte(v))
	}
	label := "onceflow.definition.v1" // what releases before Spec.Earlier hashed
	if undo {
		label = "onceflow.definition.v2"
	}
	write(label)
	write(s.Workflow)
	write(version)
	for _, st := range s.Steps {
		write(st.Name)
		if st.Key == "" {
			write(st.Kind.String())
			continue
		}
		// Not a kind's name, so that no definition without renames
		// hashes the same.
		write(st.Kind.String() + " keyed")
		write(st.Key)
	}
	write("state " + state)
	if undo {
		write("compensated " + strconv.Itoa(len(s.Compensation.Steps)))
		for _, step := range s.Compensation.Steps {
			write(step)
		}
		write("no return after " + s.Compensation.NoReturnAfter)
	}
	return hex.EncodeToString(h.Sum(nil)[:fingerprintLength])
}

// keyStep is the name the downstream keys of the step at index i derive
// from: its first name.
func (w *Workflow[Req, State]) keyStep(i int) string { return w.spec().Steps[i].keyName() }

// firstName follows renames back from step to its first name. Each name
// is the target of one rename at most (validChanges).
func firstName(renamed map[string]string, step string) string {
	for range len(renamed) {
		found := false
		for from, to := range renamed {
			if to == step {
				step, found = from, true
				break
			}
		}
		if !found {
			break
		}
	}
	return step
}

// validChanges reports a rename or removal that contradicts the steps.
func (s Spec) validChanges() error {
	into := map[string]string{}
	for from, to := range s.Renamed {
		if other, ok := into[to]; ok {
			a, b := min(from, other), max(from, other)
			return fmt.Errorf("%w: Renamed(%q, %q) and Renamed(%q, %q): a step has one earlier name; declare the chain of renames instead",
				ErrInvalidInput, a, to, b, to)
		}
		into[to] = from
	}
	for from, to := range s.Renamed {
		if s.hasStep(from) {
			return fmt.Errorf("%w: Renamed(%q, %q): the workflow still has a step %q", ErrInvalidInput, from, to, from)
		}
		if final := s.renamedTo(from); !s.hasStep(final) {
			return fmt.Errorf("%w: Renamed(%q, %q): the workflow has no step %q", ErrInvalidInput, from, to, final)
		}
	}
	for _, r := range s.Removed {
		if s.hasStep(r) {
			return fmt.Errorf("%w: Removed(%q): the workflow still has that step", ErrInvalidInput, r)
		}
	}
	return nil
}

func (s Spec) hasStep(name string) bool { return s.index(name) >= 0 }

// index returns the position of step name, or -1.
func (s Spec) index(name string) int {
	return slices.IndexFunc(s.Steps, func(st StepInfo) bool { return st.Name == name })
}

// renamedTo follows the renames from name to its name in this definition.
func (s Spec) renamedTo(name string) string {
	for range len(s.Renamed) {
		to, ok := s.Renamed[name]
		if !ok {
			break
		}
		name = to
	}
	return name
}

// Resumable decides whether a record that definition old wrote, with
// recovery point point ("" for none), may be resumed by definition cur. It
// returns the recovery point in cur's names, or why the record must be
// parked instead. The rule:
//
//   - the steps the record may have done are every step up to and
//     including the recovery point, and the foreign step after it, if any
//     (its call may have been made before a crash);
//   - each of them, renamed as cur declares (or as old declares, for a
//     record a later definition wrote), must be cur's step at the same
//     position with the same kind, and none may be one cur removed;
//   - the foreign step that may have started must derive its downstream
//     keys from the same name in both;
//   - whatever follows them may differ: steps added, removed or changed
//     after them run as cur says;
//   - what a terminal failure could undo of them must not change: a step
//     with a compensation, unless the record is past the point of no
//     return (its step committed). So a point of no return moved past a
//     record that had passed it, or before one that had not, parks it if
//     it may have done a step with a compensation, and so does a
//     compensation added to or dropped from a step it may have done,
//     unless it is past both points of no return. A definition stored by a
//     build from before this was recorded (Compensation nil) is not
//     compared so;
//   - a committed state whose writer changed the state's shape (it
//     declares UpgradeState) is read only by a definition of the same
//     shape or with an upgrader of its own: an older release meeting a
//     newer release's record parks it instead of misreading it.
func Resumable(old Spec, point string, cur Spec) (string, string) {
	last := -1
	if point != "" {
		if last = old.index(point); last < 0 {
			return "", fmt.Sprintf("its recovery point %q is not a step of version %s", point, old.Version)
		}
	}
	done := last + 1 // old.Steps[:done] are committed
	touched := old.mayHaveRun(done)
	for i, st := range old.Steps[:touched] {
		state := "completed"
		if i >= done {
			state = "may have started"
		}
		if slices.Contains(cur.Removed, st.Name) {
			return "", fmt.Sprintf("step %s, which version %s removes, %s", st.Name, cur.Version, state)
		}
		if i >= len(cur.Steps) {
			return "", fmt.Sprintf("step %s (%s) %s, and version %s has no step %d", st.Name, st.Kind, state, cur.Version, i+1)
		}
		// One step under two names: cur renamed it, or, in a rolling
		// deploy or a rollback, old did.
		got := cur.Steps[i]
		same := got.Name == cur.renamedTo(st.Name) || old.renamedTo(got.Name) == st.Name
		if !same || got.Kind != st.Kind {
			return "", fmt.Sprintf("step %d is %s (%s) in version %s, which %s, but %s (%s) in version %s",
				i+1, st.Name, st.Kind, old.Version, state, got.Name, got.Kind, cur.Version)
		}
		if i >= done && got.keyName() != st.keyName() {
			return "", fmt.Sprintf("step %s %s with downstream keys derived from %q in version %s, but version %s derives them from %q",
				st.Name, state, st.keyName(), old.Version, cur.Version, got.keyName())
		}
	}
	if why := undoChanged(old, done, touched, cur); why != "" {
		return "", why
	}
	if last < 0 {
		return "", "" // no state committed yet
	}
	if !sameState(old, cur) && old.UpgradesState && !cur.UpgradesState {
		return "", fmt.Sprintf("version %s changed the state's shape (it declares UpgradeState), and version %s, whose state has another shape and no upgrader, cannot read it",
			old.Version, cur.Version)
	}
	return cur.Steps[last].Name, ""
}

// undoChanged reports how cur would undo differently than old what a
// record that committed old's first done steps, and may have run its first
// touched, did: "" when a terminal failure could undo the same of those
// steps under both, those with a compensation unless the record is past
// the point of no return. Their first touched steps are one (Resumable
// checked it). A definition whose Compensation is unknown (stored by an
// older build) is taken as unchanged.
func undoChanged(old Spec, done, touched int, cur Spec) string {
	if old.Compensation == nil || cur.Compensation == nil {
		return ""
	}
	oldPast, curPast := old.pastNoReturn(touched), cur.pastNoReturn(touched)
	for i, st := range old.Steps[:touched] {
		had := slices.Contains(old.Compensation.Steps, st.Name)
		has := slices.Contains(cur.Compensation.Steps, cur.Steps[i].Name)
		oldUndoes, curUndoes := had && !oldPast, has && !curPast
		if oldUndoes == curUndoes {
			continue
		}
		state := "completed"
		if i >= done {
			state = "may have started"
		}
		switch {
		case oldUndoes && curPast:
			return fmt.Sprintf("version %s would undo step %s, which %s, but the record is past the point of no return of version %s (%s)",
				old.Version, st.Name, state, cur.Version, cur.noReturn())
		case oldUndoes:
			return fmt.Sprintf("step %s, which %s, has a compensation in version %s and none in version %s, which could not undo it",
				st.Name, state, old.Version, cur.Version)
		case oldPast:
			return fmt.Sprintf("the record is past the point of no return of version %s (%s), so nothing it did may be undone, but version %s would undo step %s (%s)",
				old.Version, old.noReturn(), cur.Version, st.Name, cur.noReturn())
		default:
			return fmt.Sprintf("step %s, which %s, has no compensation in version %s, which would never undo it, and one in version %s",
				st.Name, state, old.Version, cur.Version)
		}
	}
	return ""
}

// pastNoReturn reports whether a record that may have run s's first
// touched steps (mayHaveRun) is past s's point of no return: its step has
// committed or, being a foreign step, may have made its call, and a
// terminal failure undoes nothing (the rule Workflow.PointOfNoReturn
// states).
func (s Spec) pastNoReturn(touched int) bool {
	i := s.index(s.Compensation.NoReturnAfter)
	return s.Compensation.NoReturnAfter != "" && i >= 0 && i < touched
}

// noReturn describes s's point of no return.
func (s Spec) noReturn() string {
	if s.Compensation.NoReturnAfter == "" {
		return "it declares no point of no return"
	}
	return "its point of no return is after " + s.Compensation.NoReturnAfter
}

// mayHaveRun returns how many of s's steps a record that committed the
// first done of them may have run: those, and the foreign step after them,
// whose call may have been made before a crash.
func (s Spec) mayHaveRun(done int) int {
	touched := done
	if done < len(s.Steps) && s.Steps[done].Kind == phase.KindForeign {
		touched++
	}
	return touched
}

// undoKeysKept reports why definition cur, which Resumable lets resume a
// record old wrote at point, may still not: a step cur would compensate
// (one of compensable) that the record may have done derives its
// downstream keys from another name in cur than in old. Forward, a
// completed step's keys no longer matter, but its compensation names the
// call it undoes by them (foreign.Call.Compensates), and would undo one
// that was never made. "" when every such step keeps its keys.
func undoKeysKept(old Spec, point string, cur Spec, compensable []string) string {
	touched := old.mayHaveRun(old.index(point) + 1) // index -1 for no point
	for i, st := range old.Steps[:min(touched, len(cur.Steps))] {
		got := cur.Steps[i]
		if slices.Contains(compensable, got.Name) && got.keyName() != st.keyName() {
			return fmt.Sprintf("step %s, which it may have to undo, derived its downstream keys from %q in version %s, but version %s derives them from %q",
				got.Name, st.keyName(), old.Version, cur.Version, got.keyName())
		}
	}
	return ""
}

// Finding is a recovery point at which records of an earlier definition
// would be parked by the current ones (see Diff).
type Finding struct {
	Workflow string `json:"workflow"`
	// From is the version that wrote the records; To the one that would
	// resume them ("" when the workflow is gone).
	From string `json:"from"`
	To   string `json:"to,omitempty"`
	// RecoveryPoint is "" for records with no step committed.
	RecoveryPoint string `json:"recovery_point"`
	Reason        string `json:"reason"`
}

// String says which records would park and why.
func (f Finding) String() string {
	at := "before any step"
	if f.RecoveryPoint != "" {
		at = "after " + f.RecoveryPoint
	}
	return fmt.Sprintf("%s %s %s: %s", f.Workflow, f.From, at, f.Reason)
}

// Diff lists, for definitions prev (the previous release's, as `onceflow
// workflows export` writes them) and cur (this release's), every recovery
// point at which an in-flight record of prev would be parked under cur: an
// empty result means the deploy parks nothing. A definition of prev that
// cur still registers (see Versions) finishes its own records; one
// exported by a build from before definitions recorded what they undo
// (Spec.Compensation nil) is taken for the definition of cur whose legacy
// fingerprint it has, and what it undoes is not compared. Run it in
// CI so that an unsafe change fails there, not in production.
func Diff(prev, cur []Spec) []Finding {
	var findings []Finding
	for _, old := range prev {
		if slices.ContainsFunc(cur, func(s Spec) bool { return s.Workflow == old.Workflow && s.is(old.Fingerprint) }) {
			continue
		}
		latest, ok := latestSpec(cur, old.Workflow)
		points := append([]string{""}, stepNames(old.Steps)...)
		for _, p := range points[:len(points)-1] { // a record past its last step is finished
			f := Finding{Workflow: old.Workflow, From: old.Version, RecoveryPoint: p}
			if !ok {
				f.Reason = "no current definition has this workflow"
			} else if _, f.Reason = resumeAt(old, p, latest); f.Reason == "" {
				continue
			}
			f.To = latest.Version
			findings = append(findings, f)
		}
	}
	return findings
}

// resumeAt decides, as the engine does (route) and the deploy check
// (Diff) with it, whether cur resumes a record old wrote at point: the
// recovery point in cur's names, or why the record parks.
func resumeAt(old Spec, point string, cur Spec) (string, string) {
	at, why := Resumable(old, point, cur)
	if why != "" {
		return "", why
	}
	var compensable []string
	if cur.Compensation != nil {
		compensable = cur.Compensation.Steps
	}
	if why := undoKeysKept(old, point, cur, compensable); why != "" {
		return "", why
	}
	return at, ""
}

// latestSpec returns the last spec of workflow in specs: the one new
// records use.
func latestSpec(specs []Spec, workflow string) (Spec, bool) {
	for _, s := range slices.Backward(specs) {
		if s.Workflow == workflow {
			return s, true
		}
	}
	return Spec{}, false
}

func stepNames(steps []StepInfo) []string {
	names := make([]string, len(steps))
	for i, s := range steps {
		names[i] = s.Name
	}
	return names
}

// checkVersion applies the input rules of every stored name to a version
// label, and refuses surrounding spaces, which an operator typing
// --as would not see.
func checkVersion(v string) error {
	if err := recovery.CheckName("version", v); err != nil {
		return err
	}
	if strings.TrimSpace(v) != v {
		return &recovery.InputError{Field: "version", Problem: fmt.Sprintf("%q has surrounding spaces", v)}
	}
	return nil
}
