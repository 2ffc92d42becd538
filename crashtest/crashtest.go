package crashtest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// TimeoutDefault bounds each crash point's experiment.
const TimeoutDefault = time.Minute

// World is a fresh environment for one run: a database with onceflow's
// tables and the workflow's own, whatever the workflow calls, and the
// workflow bound to them.
type World[Req, State any] struct {
	DB       workflow.DB
	Workflow *workflow.Workflow[Req, State]
	// Next is the workflow's next definition, bound to the same world: what
	// the next release deploys. Upgrade needs it; Explore ignores it.
	Next *workflow.Workflow[Req, State]
	// Check verifies the invariant after the work finished: check exactly
	// once, not at most once (one row per business effect, one effect per
	// downstream operation), or a step skipped on recovery goes unnoticed.
	// nil checks nothing beyond the responses.
	Check func(ctx context.Context) error
	// Close, if set, is called when the world is no longer needed.
	Close func()
}

// Case is a workflow and a request to crash at every point. A Case whose
// world makes the workflow fail for good before its point of no return
// explores its compensations too (see the package doc, Compensation).
type Case[Req, State any] struct {
	// NewWorld builds a fresh world. It is called once for the uncrashed
	// run and once per crash point and recovery.
	NewWorld func(ctx context.Context) (*World[Req, State], error)
	// Request is what the client sends.
	Request Req
	// Key is the idempotency key; the zero value means tenant "crashtest",
	// key "crashtest-1".
	Key workflow.Key
	// Config configures the engines (Schema, Lease, MaxAttempts...).
	// Hooks are set by the harness.
	Config workflow.Config
	// SameResponse compares a recovered response with the uncrashed one.
	// nil means equal status, headers and body bytes. Mind identifiers from
	// sequences: a sequence is not transactional, so a crash before a
	// commit skips the numbers the attempt drew, and the recovered response
	// carries the next ones.
	SameResponse func(want, got workflow.Response) error
	// Timeout bounds each experiment; 0 means TimeoutDefault.
	Timeout time.Duration
}

// Recovery is how a crashed attempt's work is finished.
type Recovery string

const (
	// Retry: the client sends the same request with the same key.
	Retry Recovery = "retry"
	// Resume: a sweeper resumes from the stored request (Engine.Resume).
	Resume Recovery = "resume"
)

// Outcome is one experiment: a crash point and a recovery.
type Outcome struct {
	Point    workflow.CrashPoint
	Recovery Recovery
	// Parked reports that the recovering definition parked the record
	// (Upgrade), and an operator's resume as the definition that wrote it
	// finished the work.
	Parked bool
	// Err is nil when the experiment passed.
	Err error
}

// Report is what Explore found.
type Report struct {
	// Definition is the definition stopped at each crash point.
	Definition workflow.Spec
	// Response is the uncrashed run's response.
	Response workflow.Response
	// Compensated and Failed are the uncrashed run's Result.Compensated and
	// Result.Failed: it failed for good and undid its started steps, or
	// undid nothing. Every recovery must answer the same.
	Compensated, Failed bool
	// Points are the crash points the uncrashed run passed, in order: the
	// forward path's, then, for a run that compensated, the compensation
	// path's.
	Points []workflow.CrashPoint
	// Unreached are the definition's crash points this request never
	// passes: forward points after a step that ends the workflow early,
	// for example. Compensation points ([workflow.CompensationPoints]) are
	// listed only for a run that compensated (the compensations of steps
	// it never started); a run that succeeds passes none of them, and a
	// Case whose world makes the workflow fail for good explores them.
	Unreached []workflow.CrashPoint
	Outcomes  []Outcome
}

// answer is what the uncrashed run answered.
func (r *Report) answer() answer {
	return answer{Response: r.Response, Compensated: r.Compensated, Failed: r.Failed}
}

// answer is what a run answered: the response, and whether it was a stored
// failure that undid the started steps or one that undid nothing.
type answer struct {
	Response            workflow.Response
	Compensated, Failed bool
}

// Err joins every failed experiment's error; nil when all passed.
func (r *Report) Err() error {
	var errs []error
	for _, o := range r.Outcomes {
		if o.Err != nil {
			errs = append(errs, fmt.Errorf("crash %s, %s: %w", o.Point, o.Recovery, o.Err))
		}
	}
	return errors.Join(errs...)
}

// Parked lists, in order, the crash points after which a recovery parked
// the record (Upgrade).
func (r *Report) Parked() []workflow.CrashPoint {
	return r.pointsWhere(func(o Outcome) bool { return o.Parked })
}

// Resumed lists, in order, the crash points after which a recovery
// finished the work without parking the record: it resumed the record,
// replayed it, or ran the workflow afresh when the crash came before the
// claim. A point at which one recovery parked and the other did not is in
// both lists.
func (r *Report) Resumed() []workflow.CrashPoint {
	return r.pointsWhere(func(o Outcome) bool { return !o.Parked })
}

func (r *Report) pointsWhere(match func(Outcome) bool) []workflow.CrashPoint {
	var points []workflow.CrashPoint
	for _, o := range r.Outcomes {
		if match(o) && !slices.Contains(points, o.Point) {
			points = append(points, o.Point)
		}
	}
	return points
}

// failTest fails t for every failed experiment of r, each message after
// prefix.
func (r *Report) failTest(t testing.TB, prefix string) {
	t.Helper()
	for _, o := range r.Outcomes {
		if o.Err != nil {
			t.Errorf("%scrash %s, recovered by %s: %v", prefix, o.Point, o.Recovery, o.Err)
		}
	}
}

// Run explores c and fails t for every experiment that fails.
func Run[Req, State any](t testing.TB, c Case[Req, State]) *Report {
	t.Helper()
	report, err := Explore(context.Background(), c)
	if err != nil {
		t.Fatalf("crashtest: %v", err)
	}
	report.failTest(t, "")
	t.Logf("crashtest: %d crash points x 2 recoveries, %d unreached", len(report.Points), len(report.Unreached))
	return report
}

// Explore runs every experiment and reports each. Its error is for a case
// that cannot be explored at all (the uncrashed run fails).
func Explore[Req, State any](ctx context.Context, c Case[Req, State]) (*Report, error) {
	c = c.withDefaults()
	report, err := c.baseline(ctx, (*World[Req, State]).current)
	if err != nil {
		return nil, err
	}
	c.crashEach(ctx, report, deployment[Req, State]{
		crashed: (*World[Req, State]).current, recovering: (*World[Req, State]).current,
		crashedRun: report.answer(), recoveringRun: report.answer(),
	})
	return report, nil
}

func (c Case[Req, State]) withDefaults() Case[Req, State] {
	if c.Key == (workflow.Key{}) {
		c.Key = workflow.Key{Tenant: "crashtest", ID: "crashtest-1"}
	}
	c.Timeout = cmp.Or(c.Timeout, TimeoutDefault)
	if c.SameResponse == nil {
		c.SameResponse = sameResponse
	}
	return c
}

// definition picks one of a world's definitions of its workflow.
type definition[Req, State any] func(*World[Req, State]) *workflow.Workflow[Req, State]

func (w *World[Req, State]) current() *workflow.Workflow[Req, State] { return w.Workflow }
func (w *World[Req, State]) next() *workflow.Workflow[Req, State]    { return w.Next }

// deployment is which definition an exploration stops at each crash point
// and which recovers: the same one for Explore; for Upgrade, one release's
// and the other's.
type deployment[Req, State any] struct {
	crashed, recovering definition[Req, State]
	// crashedRun and recoveringRun are their uncrashed runs' answers.
	crashedRun, recoveringRun answer
	// mayPark: the recovering definition may park the record instead of
	// resuming it (Upgrade).
	mayPark bool
}

// crashEach runs, for every crash point of report, an experiment with each
// recovery, and adds their outcomes to report.
func (c Case[Req, State]) crashEach(ctx context.Context, report *Report, d deployment[Req, State]) {
	for _, p := range report.Points {
		for _, r := range []Recovery{Retry, Resume} {
			parked, err := c.experiment(ctx, d, p, r)
			report.Outcomes = append(report.Outcomes, Outcome{Point: p, Recovery: r, Parked: parked, Err: err})
		}
	}
}

// baseline runs the definition pick chooses without crashing, recording
// the crash points it passes.
func (c Case[Req, State]) baseline(ctx context.Context, pick definition[Req, State]) (*Report, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	world, err := c.NewWorld(ctx)
	if err != nil {
		return nil, fmt.Errorf("new world: %w", err)
	}
	defer closeWorld(world)
	w := pick(world)
	if w == nil {
		return nil, errors.New("the world has no Next definition to upgrade to")
	}
	report := &Report{Definition: w.Spec()}
	cfg := c.Config
	cfg.Hooks = &workflow.Hooks{CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
		report.Points = append(report.Points, p)
		return nil
	}}
	engine, err := workflow.NewEngine(world.DB, cfg)
	if err != nil {
		return nil, err
	}
	res, err := w.Run(ctx, engine, c.Key, c.Request)
	if err != nil {
		return nil, fmt.Errorf("the uncrashed run failed: %w", err)
	}
	if err := check(ctx, world); err != nil {
		return nil, fmt.Errorf("the uncrashed run breaks the invariant: %w", err)
	}
	report.Response, report.Compensated, report.Failed = res.Response, res.Compensated, res.Failed
	report.Unreached = unreached(w, report)
	return report, nil
}

// unreached lists the crash points of w that report's uncrashed run did
// not pass: forward ones, and compensation ones when it compensated.
func unreached(w workflow.Definition, report *Report) []workflow.CrashPoint {
	points := workflow.CrashPoints(w)
	if report.Compensated {
		points = append(points, workflow.CompensationPoints(w)...)
	}
	var missed []workflow.CrashPoint
	for _, p := range points {
		if !slices.Contains(report.Points, p) {
			missed = append(missed, p)
		}
	}
	return missed
}

// experiment stops a run of d's crashed definition at point, recovers it
// with d's recovering one, and wakes the stopped attempt. Before a commit,
// the attempt dies instead, its transaction rolled back: stalling there
// would hold the locks recovery needs. It reports whether the recovery
// parked the record.
func (c Case[Req, State]) experiment(ctx context.Context, d deployment[Req, State], point workflow.CrashPoint, how Recovery) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	world, err := c.NewWorld(ctx)
	if err != nil {
		return false, fmt.Errorf("new world: %w", err)
	}
	defer closeWorld(world)

	zombie := c.crashingRun(ctx, world.DB, d.crashed(world), point)
	defer zombie.finish() // never leave it blocked or running
	select {
	case <-zombie.crashed:
	case <-zombie.done:
		// A run killed before a commit ends at once after its crash point:
		// both may be ready, and select picks either.
		select {
		case <-zombie.crashed:
		default:
			return false, fmt.Errorf("the run finished without reaching the crash point (err: %v)", zombie.finish().err)
		}
	case <-ctx.Done():
		return false, fmt.Errorf("waiting for the crash: %w", ctx.Err())
	}
	if point.Kind == workflow.BeforeCommit {
		// The killed attempt rolls its transaction back on its way out, as
		// the server would once its connection closed; until then its
		// uncommitted claim holds the key's row, and a recovery meeting it
		// would be answered "in flight" (on a loaded machine, often).
		select {
		case <-zombie.done:
		case <-ctx.Done():
			return false, fmt.Errorf("waiting for the killed attempt to roll back: %w", ctx.Err())
		}
	}

	recovering := d.recovering(world)
	engine, err := workflow.NewEngine(world.DB, c.recoveryConfig(recovering))
	if err != nil {
		return false, err
	}
	if err := engine.Store().ExpireLease(ctx, c.Key); err != nil && !errors.Is(err, workflow.ErrNotFound) {
		return false, fmt.Errorf("expire the lease: %w", err)
	}
	fin, err := c.recover(ctx, engine, world, d, how)
	if err != nil {
		return fin.parked, fmt.Errorf("recovery failed: %w", err)
	}
	return fin.parked, c.verify(ctx, world, engine, recovering, fin, zombie)
}

// verify checks a recovery that finished as fin: the invariant, the
// response, and the definition the record names; then wakes the stopped
// attempt, checks that it was fenced out and the invariant still holds,
// and that a final retry with recovering replays the response.
func (c Case[Req, State]) verify(ctx context.Context, world *World[Req, State], e *workflow.Engine,
	recovering *workflow.Workflow[Req, State], fin finish[Req, State], z *zombie,
) error {
	var errs []error
	if err := check(ctx, world); err != nil {
		errs = append(errs, fmt.Errorf("after recovery: %w", err))
	}
	if err := c.sameAnswer(fin.want, fin.res); err != nil {
		errs = append(errs, fmt.Errorf("the recovered answer differs from the uncrashed one of version %s: %w", fin.by.Spec().Version, err))
	}
	if err := c.finishedBy(ctx, e, fin.by); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}

	if err := c.fencedOut(ctx, e, fin.want, z); err != nil {
		return err
	}
	if err := check(ctx, world); err != nil {
		return fmt.Errorf("after the crashed attempt woke: %w", err)
	}

	replay, err := recovering.Run(ctx, e, c.Key, c.Request)
	switch {
	case err != nil:
		return fmt.Errorf("final retry: %w", err)
	case !replay.Replayed:
		return errors.New("the final retry ran the workflow again instead of replaying")
	}
	if err := c.sameAnswer(fin.want, replay); err != nil {
		return fmt.Errorf("the final retry's answer: %w", err)
	}
	return nil
}

// sameAnswer compares a run's result with want, an uncrashed run's answer:
// the response by SameResponse, and whether both compensated or failed.
func (c Case[Req, State]) sameAnswer(want answer, got *workflow.Result) error {
	switch {
	case got.Compensated != want.Compensated:
		return fmt.Errorf("the result says compensated %t, want %t (response %d %s)", got.Compensated, want.Compensated, got.Response.Status, got.Response.Body)
	case got.Failed != want.Failed:
		return fmt.Errorf("the result says failed %t, want %t (response %d %s)", got.Failed, want.Failed, got.Response.Status, got.Response.Body)
	}
	return c.SameResponse(want.Response, got.Response)
}

// recoveryConfig configures a new process that registers w alone.
func (c Case[Req, State]) recoveryConfig(w *workflow.Workflow[Req, State]) workflow.Config {
	cfg := c.Config
	cfg.Hooks = nil
	cfg.Workflows = []workflow.Definition{w}
	return cfg
}

// finish is how a recovery ended: its result, the definition that
// finished the work, whose uncrashed response the result must equal, and
// whether the record was parked on the way.
type finish[Req, State any] struct {
	res    *workflow.Result
	by     *workflow.Workflow[Req, State]
	want   answer
	parked bool
}

// recover finishes the crashed work with d's recovering definition on e,
// as a client's retry or a sweeper would. The work is finished by the
// recovering definition, unless the crashed attempt had finished it, or
// the recovery parked the record: then an operator resumes it as the
// definition that wrote it.
func (c Case[Req, State]) recover(ctx context.Context, e *workflow.Engine, world *World[Req, State], d deployment[Req, State], how Recovery) (finish[Req, State], error) {
	crashed, recovering := d.crashed(world), d.recovering(world)
	fin := finish[Req, State]{by: recovering, want: d.recoveringRun}
	rec, err := e.Store().Load(ctx, c.Key)
	switch {
	case err == nil && rec.Finished():
		fin.by, fin.want = crashed, d.crashedRun
	case err != nil && !errors.Is(err, workflow.ErrNotFound):
		return fin, fmt.Errorf("load the crashed record: %w", err)
	}
	fin.res, err = c.recoverWith(ctx, e, recovering, how)
	if d.mayPark && errors.Is(err, workflow.ErrParked) {
		fin.by, fin.want, fin.parked = crashed, d.crashedRun, true
		fin.res, err = c.resumeParked(ctx, world.DB, crashed)
	}
	return fin, err
}

// recoverWith finishes the crashed work with w, as a client's retry or a
// sweeper would. A sweeper has nothing to resume when the crash came
// before the claim; then the client's retry is what happens.
func (c Case[Req, State]) recoverWith(ctx context.Context, e *workflow.Engine, w *workflow.Workflow[Req, State], how Recovery) (*workflow.Result, error) {
	if how == Resume {
		res, err := e.Resume(ctx, c.Key)
		if !errors.Is(err, workflow.ErrNotFound) {
			return res, err
		}
	}
	return w.Run(ctx, e, c.Key, c.Request)
}

// resumeParked resolves the record a recovery parked, as an operator
// would: it checks that the record is parked without a lease, then resumes
// it as wrote, the definition that wrote it (Engine.ResumeAs), from a
// process that registers wrote.
func (c Case[Req, State]) resumeParked(ctx context.Context, db workflow.DB, wrote *workflow.Workflow[Req, State]) (*workflow.Result, error) {
	operator, err := workflow.NewEngine(db, c.recoveryConfig(wrote))
	if err != nil {
		return nil, err
	}
	rec, err := operator.Store().Load(ctx, c.Key)
	if err != nil {
		return nil, fmt.Errorf("load the parked record: %w", err)
	}
	if rec.Status != recovery.StatusParked || !rec.LockedUntil.IsZero() {
		return nil, fmt.Errorf("the recovery answered %w, but the record is %s, its lease until %v", workflow.ErrParked, rec.Status, rec.LockedUntil)
	}
	spec := wrote.Spec()
	res, err := operator.ResumeAs(ctx, c.Key, spec.Fingerprint)
	if err != nil {
		return nil, fmt.Errorf("resume the parked record as version %s: %w", spec.Version, err)
	}
	return res, nil
}

// finishedBy checks that the key's record names w as the definition that
// finished it.
func (c Case[Req, State]) finishedBy(ctx context.Context, e *workflow.Engine, w *workflow.Workflow[Req, State]) error {
	rec, err := e.Store().Load(ctx, c.Key)
	if err != nil {
		return fmt.Errorf("load the recovered record: %w", err)
	}
	if spec := w.Spec(); rec.Definition != spec.Fingerprint {
		return fmt.Errorf("the record names definition %s as the one that finished it, want version %s (%s)",
			rec.Definition, spec.Version, spec.Fingerprint)
	}
	return nil
}

// errKilled stops an attempt at a crash point inside a transaction.
var errKilled = errors.New("killed before its commit")

// fencedOut wakes the stopped attempt and checks what it did: it lost its
// lease, died at its crash point, answered with the response the key
// holds, or failed (a step of it may conflict with what the recovery
// wrote, such as a row with the same unique key); and it wrote nothing to
// the key's record.
func (c Case[Req, State]) fencedOut(ctx context.Context, e *workflow.Engine, want answer, z *zombie) error {
	before, err := e.Store().Load(ctx, c.Key)
	if err != nil {
		return fmt.Errorf("load the recovered record: %w", err)
	}
	r := z.finish()
	after, err := e.Store().Load(ctx, c.Key)
	if err != nil {
		return fmt.Errorf("load the record after the stopped attempt woke: %w", err)
	}
	if err := sameRecord(before, after); err != nil {
		return fmt.Errorf("the woken attempt (which returned error %v) wrote the key's record: %w", r.err, err)
	}
	if r.err != nil {
		return nil
	}
	if err := c.sameAnswer(want, r.res); err != nil {
		return fmt.Errorf("the woken attempt answered differently: %w", err)
	}
	return nil
}

// sameRecord reports how got differs from want in what a write to a key
// record changes.
func sameRecord(want, got *recovery.Record) error {
	type written struct {
		Owner                                uuid.UUID
		Status                               recovery.Status
		RecoveryPoint, Definition, LastError string
		State, Undo                          string
		Attempts                             int
		UpdatedAt, CompletedAt               time.Time
	}
	w := written{want.Owner, want.Status, want.RecoveryPoint, want.Definition, want.LastError, string(want.State),
		fmt.Sprintf("%q", want.Undo), want.Attempts, want.UpdatedAt, want.CompletedAt}
	g := written{got.Owner, got.Status, got.RecoveryPoint, got.Definition, got.LastError, string(got.State),
		fmt.Sprintf("%q", got.Undo), got.Attempts, got.UpdatedAt, got.CompletedAt}
	if w != g {
		return fmt.Errorf("%+v, was %+v", g, w)
	}
	return nil
}

// zombie is an attempt stopped at a crash point.
type zombie struct {
	crashed chan struct{}
	woken   chan struct{}
	done    chan struct{}
	result  result

	wakeOnce sync.Once
}

type result struct {
	res *workflow.Result
	err error
}

// finish wakes the attempt if it is stopped, waits for it to end, and
// returns what it returned. The experiment's context bounds the wait.
func (z *zombie) finish() result {
	z.wakeOnce.Do(func() { close(z.woken) })
	<-z.done
	return z.result
}

// crashingRun starts w on db with an engine that stops at point: the
// attempt blocks there, holding nothing, until woken.
func (c Case[Req, State]) crashingRun(ctx context.Context, db workflow.DB, w *workflow.Workflow[Req, State], point workflow.CrashPoint) *zombie {
	z := &zombie{crashed: make(chan struct{}), woken: make(chan struct{}), done: make(chan struct{})}
	var once sync.Once
	cfg := c.Config
	cfg.Hooks = &workflow.Hooks{CrashPoint: func(ctx context.Context, _ workflow.Key, p workflow.CrashPoint) error {
		if p != point {
			return nil
		}
		hit := false
		once.Do(func() { hit = true })
		if !hit {
			return nil
		}
		close(z.crashed)
		if p.Kind == workflow.BeforeCommit {
			// A transaction is open: the attempt dies, and its transaction
			// rolls back, as its connection would close.
			return errKilled
		}
		// Otherwise the attempt stalls here holding nothing, until woken.
		select {
		case <-z.woken:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}}
	go func() {
		defer close(z.done)
		engine, err := workflow.NewEngine(db, cfg)
		if err != nil {
			z.result.err = err
			return
		}
		z.result.res, z.result.err = w.Run(ctx, engine, c.Key, c.Request)
	}()
	return z
}

func check[Req, State any](ctx context.Context, world *World[Req, State]) error {
	if world.Check == nil {
		return nil
	}
	return world.Check(ctx)
}

func closeWorld[Req, State any](world *World[Req, State]) {
	if world.Close != nil {
		world.Close()
	}
}

// SameResponseExcept returns a Case.SameResponse that wants equal status
// and headers, and JSON bodies that are equal once the named top-level
// fields are removed from both: for fields that may differ in a recovered
// response, such as an id a sequence handed out (a rolled-back attempt
// skips the number it drew). A body that is not a JSON object must be
// equal byte for byte.
func SameResponseExcept(fields ...string) func(want, got workflow.Response) error {
	return func(want, got workflow.Response) error {
		w, wok := withoutFields(want.Body, fields)
		g, gok := withoutFields(got.Body, fields)
		if !wok || !gok {
			return sameResponse(want, got)
		}
		want.Body, got.Body = w, g
		return sameResponse(want, got)
	}
}

// withoutFields returns body, a JSON object, re-encoded without fields, and
// whether it was a JSON object.
func withoutFields(body []byte, fields []string) ([]byte, bool) {
	var object map[string]json.RawMessage
	if err := json.Unmarshal(body, &object); err != nil || object == nil {
		return nil, false
	}
	for _, f := range fields {
		delete(object, f)
	}
	out, err := json.Marshal(object)
	return out, err == nil
}

func sameResponse(want, got workflow.Response) error {
	switch {
	case want.Status != got.Status:
		return fmt.Errorf("status %d, want %d", got.Status, want.Status)
	case !reflect.DeepEqual(http.Header(want.Header), http.Header(got.Header)):
		return fmt.Errorf("headers %v, want %v", got.Header, want.Header)
	case !bytes.Equal(want.Body, got.Body):
		return fmt.Errorf("body %s, want %s", got.Body, want.Body)
	}
	return nil
}
