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
	// Check verifies the invariant after the work finished: check exactly
	// once, not at most once (one row per business effect, one effect per
	// downstream operation), or a step skipped on recovery goes unnoticed.
	// nil checks nothing beyond the responses.
	Check func(ctx context.Context) error
	// Close, if set, is called when the world is no longer needed.
	Close func()
}

// Case is a workflow and a request to crash at every point.
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
	// Err is nil when the experiment passed.
	Err error
}

// Report is what Explore found.
type Report struct {
	// Response is the uncrashed run's response.
	Response workflow.Response
	// Points are the crash points the uncrashed run passed, in order.
	Points []workflow.CrashPoint
	// Unreached are the definition's crash points this request never
	// passes (after a step that ends the workflow early, for example).
	Unreached []workflow.CrashPoint
	Outcomes  []Outcome
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

// Run explores c and fails t for every experiment that fails.
func Run[Req, State any](t testing.TB, c Case[Req, State]) *Report {
	t.Helper()
	report, err := Explore(context.Background(), c)
	if err != nil {
		t.Fatalf("crashtest: %v", err)
	}
	for _, o := range report.Outcomes {
		if o.Err != nil {
			t.Errorf("crash %s, recovered by %s: %v", o.Point, o.Recovery, o.Err)
		}
	}
	t.Logf("crashtest: %d crash points x 2 recoveries, %d unreached", len(report.Points), len(report.Unreached))
	return report
}

// Explore runs every experiment and reports each. Its error is for a case
// that cannot be explored at all (the uncrashed run fails).
func Explore[Req, State any](ctx context.Context, c Case[Req, State]) (*Report, error) {
	if c.Key == (workflow.Key{}) {
		c.Key = workflow.Key{Tenant: "crashtest", ID: "crashtest-1"}
	}
	c.Timeout = cmp.Or(c.Timeout, TimeoutDefault)
	if c.SameResponse == nil {
		c.SameResponse = sameResponse
	}
	report, err := c.baseline(ctx)
	if err != nil {
		return nil, err
	}
	for _, p := range report.Points {
		for _, r := range []Recovery{Retry, Resume} {
			report.Outcomes = append(report.Outcomes, Outcome{Point: p, Recovery: r, Err: c.experiment(ctx, report.Response, p, r)})
		}
	}
	return report, nil
}

// baseline runs the workflow without crashing, recording the crash points
// it passes.
func (c Case[Req, State]) baseline(ctx context.Context) (*Report, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	world, err := c.NewWorld(ctx)
	if err != nil {
		return nil, fmt.Errorf("new world: %w", err)
	}
	defer closeWorld(world)
	report := &Report{}
	cfg := c.Config
	cfg.Hooks = &workflow.Hooks{CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
		report.Points = append(report.Points, p)
		return nil
	}}
	engine, err := workflow.NewEngine(world.DB, cfg)
	if err != nil {
		return nil, err
	}
	res, err := world.Workflow.Run(ctx, engine, c.Key, c.Request)
	if err != nil {
		return nil, fmt.Errorf("the uncrashed run failed: %w", err)
	}
	if err := check(ctx, world); err != nil {
		return nil, fmt.Errorf("the uncrashed run breaks the invariant: %w", err)
	}
	report.Response = res.Response
	passed := map[workflow.CrashPoint]bool{}
	for _, p := range report.Points {
		passed[p] = true
	}
	for _, p := range workflow.CrashPoints(world.Workflow) {
		if !passed[p] {
			report.Unreached = append(report.Unreached, p)
		}
	}
	return report, nil
}

// experiment crashes a run at point, recovers it, and wakes the crashed
// attempt. Before a commit, the attempt dies instead, its transaction rolled
// back: stalling there would hold the locks recovery needs.
func (c Case[Req, State]) experiment(ctx context.Context, want workflow.Response, point workflow.CrashPoint, how Recovery) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	world, err := c.NewWorld(ctx)
	if err != nil {
		return fmt.Errorf("new world: %w", err)
	}
	defer closeWorld(world)

	zombie := c.crashingRun(ctx, world, point)
	defer zombie.finish() // never leave it blocked or running
	select {
	case <-zombie.crashed:
	case <-zombie.done:
		return fmt.Errorf("the run finished without reaching the crash point (err: %v)", zombie.finish().err)
	case <-ctx.Done():
		return fmt.Errorf("waiting for the crash: %w", ctx.Err())
	}

	recovering, err := workflow.NewEngine(world.DB, c.recoveryConfig(world))
	if err != nil {
		return err
	}
	if err := recovering.Store().ExpireLease(ctx, c.Key); err != nil && !errors.Is(err, workflow.ErrNotFound) {
		return fmt.Errorf("expire the lease: %w", err)
	}
	got, err := c.recover(ctx, recovering, world, how)
	if err != nil {
		return fmt.Errorf("recovery failed: %w", err)
	}
	var errs []error
	if err := check(ctx, world); err != nil {
		errs = append(errs, fmt.Errorf("after recovery: %w", err))
	}
	if err := c.SameResponse(want, got.Response); err != nil {
		errs = append(errs, fmt.Errorf("the recovered response differs from the uncrashed one: %w", err))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}

	if err := c.fencedOut(ctx, recovering, want, zombie); err != nil {
		return err
	}
	if err := check(ctx, world); err != nil {
		return fmt.Errorf("after the crashed attempt woke: %w", err)
	}

	replay, err := world.Workflow.Run(ctx, recovering, c.Key, c.Request)
	switch {
	case err != nil:
		return fmt.Errorf("final retry: %w", err)
	case !replay.Replayed:
		return errors.New("the final retry ran the workflow again instead of replaying")
	}
	return c.SameResponse(want, replay.Response)
}

func (c Case[Req, State]) recoveryConfig(world *World[Req, State]) workflow.Config {
	cfg := c.Config
	cfg.Hooks = nil
	cfg.Workflows = []workflow.Definition{world.Workflow}
	return cfg
}

// recover finishes the crashed work as a client's retry or a sweeper would.
// A sweeper has nothing to resume when the crash came before the claim;
// then the client's retry is what happens.
func (c Case[Req, State]) recover(ctx context.Context, e *workflow.Engine, world *World[Req, State], how Recovery) (*workflow.Result, error) {
	if how == Resume {
		res, err := e.Resume(ctx, c.Key)
		if !errors.Is(err, workflow.ErrNotFound) {
			return res, err
		}
	}
	return world.Workflow.Run(ctx, e, c.Key, c.Request)
}

// errKilled stops an attempt at a crash point inside a transaction.
var errKilled = errors.New("killed before its commit")

// fencedOut wakes the stopped attempt and checks what it did: it lost its
// lease, died at its crash point, answered with the response the key
// holds, or failed (a step of it may conflict with what the recovery
// wrote, such as a row with the same unique key); and it wrote nothing to
// the key's record.
func (c Case[Req, State]) fencedOut(ctx context.Context, e *workflow.Engine, want workflow.Response, z *zombie) error {
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
	if err := c.SameResponse(want, r.res.Response); err != nil {
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
		State                                string
		Attempts                             int
		UpdatedAt, CompletedAt               time.Time
	}
	w := written{want.Owner, want.Status, want.RecoveryPoint, want.Definition, want.LastError, string(want.State), want.Attempts, want.UpdatedAt, want.CompletedAt}
	g := written{got.Owner, got.Status, got.RecoveryPoint, got.Definition, got.LastError, string(got.State), got.Attempts, got.UpdatedAt, got.CompletedAt}
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

// crashingRun starts the workflow with an engine that stops at point: the
// attempt blocks there, holding nothing, until woken.
func (c Case[Req, State]) crashingRun(ctx context.Context, world *World[Req, State], point workflow.CrashPoint) *zombie {
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
		engine, err := workflow.NewEngine(world.DB, cfg)
		if err != nil {
			z.result.err = err
			return
		}
		z.result.res, z.result.err = world.Workflow.Run(ctx, engine, c.Key, c.Request)
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
