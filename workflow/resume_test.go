package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// crashAt returns hooks that stop an attempt at point, as a process death
// would.
func crashAt(point workflow.CrashPoint) *workflow.Hooks {
	return &workflow.Hooks{CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
		if p == point {
			return errors.New("killed")
		}
		return nil
	}}
}

func TestTakeoverResumesFromRecoveryPoint(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	crashing := w.engine(workflow.Config{Hooks: crashAt(workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"})})

	_, err := wf.Run(w.ctx, crashing, acme, order)
	require.ErrorIs(t, err, workflow.ErrCrashed)
	rec, err := crashing.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.False(t, rec.Released, "a crash releases nothing")
	require.Equal(t, "create_order", rec.RecoveryPoint)

	e := w.engine(workflow.Config{})
	_, err = wf.Run(w.ctx, e, acme, order)
	require.ErrorIs(t, err, workflow.ErrInFlight, "the dead attempt's lease still holds")

	require.NoError(t, e.Store().ExpireLease(w.ctx, acme))
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
	require.Equal(t, "create_order", res.ResumedFrom)
	require.Equal(t, 201, res.Response.Status)
	require.Equal(t, 1, w.orders())
	require.Equal(t, 1, w.provider.Effects("charges"))
	keys := w.provider.Keys("charges")
	require.Len(t, keys, 2, "the charge was sent twice…")
	require.Equal(t, keys[0], keys[1], "…with the same derived key")

	rec, err = e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, 1, rec.Attempts, "the crashed attempt is counted")
}

// TestResumeWithoutClient: the sweeper's path, from the stored request.
func TestResumeWithoutClient(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	crashing := w.engine(workflow.Config{Hooks: crashAt(workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"})})
	_, err := wf.Run(w.ctx, crashing, acme, order)
	require.ErrorIs(t, err, workflow.ErrCrashed)

	// Another process knows the workflow by name only.
	sweeper := w.engine(workflow.Config{Workflows: []workflow.Definition{wf}})
	_, err = sweeper.Resume(w.ctx, acme)
	require.ErrorIs(t, err, workflow.ErrInFlight)
	require.NoError(t, sweeper.Store().ExpireLease(w.ctx, acme))

	res, err := sweeper.Resume(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
	require.Equal(t, "create_order", res.ResumedFrom)
	require.JSONEq(t, `{"order_id":1,"charge_id":"ch_1","status":"paid"}`, string(res.Response.Body))

	client, err := wf.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.NoError(t, err)
	require.True(t, client.Replayed, "the client's retry gets the sweeper's response")
	require.Equal(t, res.Response, client.Response)
	again, err := sweeper.Resume(w.ctx, acme)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, 1, w.orders())
	require.Equal(t, 1, w.provider.Effects("charges"))
}

func TestResumeErrors(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	_, err := w.engine(workflow.Config{}).Resume(w.ctx, acme)
	require.ErrorIs(t, err, workflow.ErrNotFound)

	crashing := w.engine(workflow.Config{Hooks: crashAt(workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"})})
	_, err = wf.Run(w.ctx, crashing, acme, order)
	require.ErrorIs(t, err, workflow.ErrCrashed)
	require.NoError(t, crashing.Store().ExpireLease(w.ctx, acme))
	_, err = w.engine(workflow.Config{}).Resume(w.ctx, acme)
	require.ErrorIs(t, err, workflow.ErrUnknownWorkflow, "an engine that does not know the workflow leaves it alone")
	rec, err := crashing.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Zero(t, rec.Attempts, "and does not touch it")
}

// TestZombieIsFencedOut: an attempt stalls inside an atomic phase past its
// lease; another takes over, and while the new owner is in flight (in its
// charge), the stalled one wakes and tries to commit: only the owner token
// tells the two apart then. Its transaction rolls back, and the new owner
// finishes and its result stands.
func TestZombieIsFencedOut(t *testing.T) {
	w := newWorld(t)
	stalled, wake := make(chan struct{}), make(chan struct{})
	zombieDone := make(chan error, 1)
	first, charges := true, 0
	w.before = func(ctx context.Context, step string) error {
		switch {
		case step == "record_charge" && first:
			first = false
			close(stalled)
			<-wake
		case step == "charge":
			if charges++; charges == 2 { // the new owner's charge
				close(wake) // the zombie now inserts its ledger row and tries to commit
				require.ErrorIs(t, <-zombieDone, workflow.ErrLeaseLost)
			}
		}
		return nil
	}
	wf := w.checkout()
	zombie := w.engine(workflow.Config{})
	go func() {
		_, err := wf.Run(w.ctx, zombie, acme, order)
		zombieDone <- err
	}()
	<-stalled

	e := w.engine(workflow.Config{})
	require.NoError(t, e.Store().ExpireLease(w.ctx, acme))
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	require.Equal(t, 2, charges, "the zombie woke while the new owner was in flight")
	require.Equal(t, 1, w.ledger(), "the zombie's write rolled back")
	require.Equal(t, 1, w.orders())
	stored, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, res.Response, stored.Response, "the new owner's result stands")
}

// commitBudget is the rule TestCommitBudget holds the engine to, written
// once. It counts the transactions one call commits as PostgreSQL counts
// them (pg_stat_database.xact_commit, which pgtrace mirrors: a statement
// sent on its own is a transaction too, even one that writes nothing).
//
// ran lists the kinds of the steps the call runs, in order ('A' an atomic
// phase, 'F' a foreign mutation), the last of them ending the workflow: its
// last step, or a step that returns Respond or Reject. It is "" for a
// replay, which runs nothing.
//
//   - Each atomic phase commits once, with the recovery point; the one that
//     ends the workflow, with the completion.
//   - The claim rides in the first phase's transaction when the first step
//     to run is atomic; otherwise (claimAlone) it is a statement on its own.
//     For a replay that statement only reads: when the workflow's first step
//     is atomic, a replay's claim opens a transaction that is rolled back,
//     and the replay commits nothing.
//   - A foreign step's result rides in the next atomic phase's transaction;
//     a foreign step followed by another, or ending the workflow, commits
//     its result on its own.
//   - Resume reads the record before taking it over: one more statement.
//   - A Reject (before anything committed) commits no step; a claim that
//     had committed alone is deleted, one more commit.
func commitBudget(ran string, claimAlone, resumed, rejected bool) int64 {
	var n int64
	if resumed {
		n++
	}
	if claimAlone {
		n++
	}
	if rejected {
		if claimAlone {
			n++
		}
		return n
	}
	for i, kind := range ran {
		last := i == len(ran)-1
		if kind == 'A' || last || ran[i+1] == 'F' {
			n++
		}
	}
	return n
}

// shape declares a workflow named name whose steps have the given kinds
// ('A' an atomic phase that writes a ledger row, 'F' a foreign mutation
// that does nothing), named by kind and place: "a0", "f1", …. end, if not
// nil, is what a step returns after its work: Respond, Reject or an error.
func shape(name, kinds string, end func(step string) error) *workflow.Workflow[Order, Paid] {
	done := func(step string) error {
		if end == nil {
			return nil
		}
		return end(step)
	}
	steps := make([]phase.Step[Order, Paid], len(kinds))
	for i, kind := range kinds {
		step := fmt.Sprintf("%c%d", kind+'a'-'A', i)
		if kind == 'F' {
			steps[i] = foreignStep(step, func() error { return done(step) })
			continue
		}
		steps[i] = atomicStep(step, func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			if _, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, entry) VALUES (0, $1)`, r.Step); err != nil {
				return err
			}
			return done(step)
		})
	}
	return workflow.Define(name, steps...)
}

// at returns an end that gives err at step, once.
func at(step string, err error) func(string) error {
	given := false
	return func(s string) error {
		if s != step || given {
			return nil
		}
		given = true
		return err
	}
}

// crashed returns a setup in which an attempt dies at point and its lease
// runs out.
func crashed(point workflow.CrashPoint) func(w *world, wf *workflow.Workflow[Order, Paid], key workflow.Key) {
	return func(w *world, wf *workflow.Workflow[Order, Paid], key workflow.Key) {
		e := w.engine(workflow.Config{Hooks: crashAt(point)})
		_, err := wf.Run(w.ctx, e, key, order)
		require.ErrorIs(w.t, err, workflow.ErrCrashed)
		require.NoError(w.t, e.Store().ExpireLease(w.ctx, key))
	}
}

// settled waits until no connection is out of the pool: a replay ends its
// read-only transaction after answering, and its ROLLBACK must not land in
// the next count.
func (w *world) settled() {
	w.t.Helper()
	require.Eventually(w.t, func() bool { return w.db.Stat().AcquiredConns() == 0 }, 10*time.Second, time.Millisecond)
}

// rowVersion is the transaction that last wrote key's record.
func (w *world) rowVersion(key workflow.Key) string {
	w.t.Helper()
	var xmin string
	require.NoError(w.t, w.db.QueryRow(w.ctx, `SELECT xmin::text FROM onceflow_keys WHERE tenant_id = $1 AND key = $2`,
		key.Tenant, key.ID).Scan(&xmin))
	return xmin
}

// TestCommitBudget holds every workflow shape to commitBudget: a workflow of
// N atomic phases that starts and ends with an atomic phase, with no two
// foreign steps in a row, commits N transactions; each foreign step at
// either end, and each foreign step followed by another, adds one. A replay
// commits nothing (one read-only statement when the first step is foreign)
// and leaves the record as it was.
func TestCommitBudget(t *testing.T) {
	w := newWorld(t)
	respond := workflow.Respond(workflow.Problem(402, "declined"))
	reject := workflow.Reject(workflow.Problem(422, "invalid"))
	cases := []struct {
		name  string
		kinds string                  // the workflow's steps
		end   func(step string) error // what a step returns after its work
		// setup, if set, leaves the key to be taken over.
		setup  func(w *world, wf *workflow.Workflow[Order, Paid], key workflow.Key)
		resume bool   // the counted call is Resume; otherwise Run
		ran    string // the steps the counted call runs
		// runTakeover: a retry (Run) takes over a record past its first
		// step. Run cannot know that before claiming: it opens the first
		// phase's transaction with the claim, finds the record moved on, and
		// commits the takeover alone.
		runTakeover bool
		rejected    bool
	}{
		{name: "A", kinds: "A", ran: "A"},
		{name: "AA", kinds: "AA", ran: "AA"},
		{name: "AFA (checkout)", kinds: "AFA", ran: "AFA"},
		{name: "AFFA", kinds: "AFFA", ran: "AFFA"},
		{name: "AFAFA", kinds: "AFAFA", ran: "AFAFA"},
		{name: "FA: the claim commits alone", kinds: "FA", ran: "FA"},
		{name: "AF: the completion commits alone", kinds: "AF", ran: "AF"},
		{name: "F", kinds: "F", ran: "F"},
		{name: "FF", kinds: "FF", ran: "FF"},
		{name: "FFA", kinds: "FFA", ran: "FFA"},
		{name: "AFA responding from a0", kinds: "AFA", end: at("a0", respond), ran: "A"},
		{name: "AFA responding from f1", kinds: "AFA", end: at("f1", respond), ran: "AF"},
		{name: "AFA rejecting in a0", kinds: "AFA", end: at("a0", reject), ran: "A", rejected: true},
		{name: "FA rejecting in f0", kinds: "FA", end: at("f0", reject), ran: "F", rejected: true},
		{name: "AFA taken over by a retry after a0", kinds: "AFA",
			setup: crashed(workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "a0"}), ran: "FA"},
		{name: "AA taken over by a retry after a0", kinds: "AA",
			setup: crashed(workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "a0"}), ran: "A", runTakeover: true},
		{name: "FA taken over by a retry after f0's call", kinds: "FA",
			setup: crashed(workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "f0"}), ran: "FA"},
		{name: "AA retried after a0 failed", kinds: "AA", end: at("a0", errors.New("transient")),
			setup: func(w *world, wf *workflow.Workflow[Order, Paid], key workflow.Key) {
				_, err := wf.Run(w.ctx, w.engine(workflow.Config{}), key, order)
				require.ErrorContains(w.t, err, "transient")
			}, ran: "AA"},
		{name: "AA resumed after a0", kinds: "AA", resume: true,
			setup: crashed(workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "a0"}), ran: "A"},
		{name: "AFA resumed after a0", kinds: "AFA", resume: true,
			setup: crashed(workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "a0"}), ran: "FA"},
	}
	for i, tc := range cases {
		wf := shape(fmt.Sprintf("shape%d", i), tc.kinds, tc.end)
		key := workflow.Key{Tenant: "acme", ID: wf.Name()}
		e := w.engine(workflow.Config{Workflows: []workflow.Definition{wf}})
		if tc.setup != nil {
			tc.setup(w, wf, key)
		}
		claimAlone := tc.ran[0] == 'F' || tc.runTakeover
		want := commitBudget(tc.ran, claimAlone, tc.resume, tc.rejected)
		require.NoError(t, e.SaveDefinitions(w.ctx)) // once per process, not per run

		seen := 0 // transitions before the counted call
		if rec, err := e.Store().Load(w.ctx, key); err == nil {
			seen = len(rec.History)
		}
		w.settled()
		before := w.counter.Counts()
		var res *workflow.Result
		var err error
		if tc.resume {
			res, err = e.Resume(w.ctx, key)
		} else {
			res, err = wf.Run(w.ctx, e, key, order)
		}
		require.NoError(t, err, tc.name)
		got := w.counter.Counts().Sub(before)
		require.False(t, res.Replayed, tc.name)
		require.Equal(t, tc.rejected, res.Rejected, tc.name)
		require.Equal(t, want, got.Commits, "%s: %+v", tc.name, got)
		if tc.rejected {
			require.Zero(t, w.count(`SELECT count(*) FROM onceflow_keys WHERE key = $1`, key.ID), tc.name)
			continue
		}
		// The floor: BEGIN, the statement and COMMIT per atomic phase, and a
		// round trip for each commit outside one.
		atomic := int64(strings.Count(tc.ran, "A"))
		require.LessOrEqual(t, got.RoundTrips(), 3*atomic+got.Commits-atomic, "%s: %+v", tc.name, got)

		// The history holds the recovery points the call committed (a
		// foreign step's commits with the phase after it) and its
		// completion last, written by the statements just counted.
		rec, err := e.Store().Load(w.ctx, key)
		require.NoError(t, err, tc.name)
		added, ran := rec.History[seen:], ranSteps(tc.kinds, tc.ran, tc.end != nil)
		require.Subset(t, ran, committedSteps(added), "%s: %+v", tc.name, added)
		for _, step := range ran {
			if step[0] == 'a' { // an atomic phase commits its recovery point
				require.Contains(t, committedSteps(added), step, "%s: %+v", tc.name, added)
			}
		}
		require.Equal(t, recovery.TransitionCompleted, added[len(added)-1].Kind, tc.name)
		require.Equal(t, ran[len(ran)-1], added[len(added)-1].Step, tc.name)

		version := w.rowVersion(key)
		w.settled()
		before = w.counter.Counts()
		replay, err := wf.Run(w.ctx, e, key, order)
		require.NoError(t, err, tc.name)
		require.True(t, replay.Replayed, tc.name)
		require.Equal(t, res.Response, replay.Response, tc.name)
		w.settled()
		got = w.counter.Counts().Sub(before)
		require.Equal(t, commitBudget("", tc.kinds[0] == 'F', false, false), got.Commits, "%s replayed: %+v", tc.name, got)
		require.Equal(t, version, w.rowVersion(key), "%s: a replay writes nothing", tc.name)
	}
}

// ranSteps names the steps of a shape of kinds that a call ran: the first
// len(ran) when a step responded, else the last.
func ranSteps(kinds, ran string, responded bool) []string {
	first := len(kinds) - len(ran)
	if responded {
		first = 0
	}
	var names []string
	for i := first; i < first+len(ran); i++ {
		names = append(names, fmt.Sprintf("%c%d", kinds[i]+'a'-'A', i))
	}
	return names
}

// committedSteps lists the steps that h says committed or completed.
func committedSteps(h []recovery.Transition) []string {
	var steps []string
	for _, tr := range h {
		if tr.Kind == recovery.TransitionPhaseCommitted || tr.Kind == recovery.TransitionCompleted {
			steps = append(steps, tr.Step)
		}
	}
	return steps
}

// TestHeartbeatRenewsLongSteps: a step that outlives a third of its lease
// twice has its lease renewed twice, each renewal moving it. The lease is
// long enough that renewals a third of it apart come in time on a loaded
// machine; the test lasts about two thirds of it.
func TestHeartbeatRenewsLongSteps(t *testing.T) {
	w := newWorld(t)
	renewed := make(chan time.Time, 16)
	hooks := &workflow.Hooks{LeaseRenewed: func(_ workflow.Key, step string, until time.Time, err error) {
		if err == nil && step == "slow" {
			renewed <- until
		}
	}}
	wf := workflow.Define("slow",
		foreign.Mutation("slow", func(ctx context.Context, c *foreign.Call[Order, Paid]) error {
			var seen []time.Time
			for len(seen) < 2 { // the step outlives a third of its lease twice
				select {
				case until := <-renewed:
					seen = append(seen, until)
				case <-time.After(30 * time.Second):
					return errors.New("no renewal came")
				}
			}
			if !seen[1].After(seen[0]) {
				return errors.New("the lease did not move")
			}
			return nil
		}),
	)
	e := w.engine(workflow.Config{Lease: 2 * time.Second, Hooks: hooks})
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, 200, res.Response.Status)
}

// TestHeartbeatLosingLeaseCancelsStep: when a renewal finds the key taken
// over, the step's context is cancelled and the attempt stops. The lease
// is long enough that the heartbeat's own deadline (a whole lease without
// a renewal) cannot come first on a loaded machine.
func TestHeartbeatLosingLeaseCancelsStep(t *testing.T) {
	w := newWorld(t)
	const lease = 2 * time.Second
	entered := make(chan struct{})
	lost := make(chan error, 16)
	hooks := &workflow.Hooks{LeaseRenewed: func(_ workflow.Key, _ string, _ time.Time, err error) {
		if err != nil {
			lost <- err
		}
	}}
	wf := workflow.Define("long",
		foreign.Mutation("long", func(ctx context.Context, c *foreign.Call[Order, Paid]) error {
			close(entered)
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(30 * lease):
				return errors.New("the step was never cancelled")
			}
		}),
	)
	e := w.engine(workflow.Config{Lease: lease, Hooks: hooks})
	done := make(chan error, 1)
	go func() {
		_, err := wf.Run(w.ctx, e, acme, order)
		done <- err
	}()
	<-entered
	// Another process takes the key over.
	require.NoError(t, e.Store().ExpireLease(w.ctx, acme))
	_, _, err := seam.StoreOf(e.Store()).Takeover(w.ctx, acme, "long")
	require.NoError(t, err)

	err = <-done // the hooks have all run once Run returns
	require.ErrorIs(t, err, workflow.ErrLeaseLost)
	select {
	case renewal := <-lost:
		require.ErrorIs(t, renewal, recovery.ErrLeaseLost, "a renewal found the key taken over")
		require.Empty(t, lost, "the heartbeat stopped at the first renewal that found the key taken over")
	default:
		require.Fail(t, "no renewal found the key taken over")
	}
	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.False(t, rec.Released, "a lost lease is not released: it is someone else's")
}

// TestCancelledCallerReleases: a caller that gives up stops the attempt; the
// lease is handed back so a retry resumes at once.
func TestCancelledCallerReleases(t *testing.T) {
	w := newWorld(t)
	entered := make(chan struct{})
	w.before = func(ctx context.Context, step string) error {
		if step == "charge" {
			close(entered)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}
	wf := w.checkout()
	e := w.engine(workflow.Config{})
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() {
		_, err := wf.Run(ctx, e, acme, order)
		done <- err
	}()
	<-entered
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.True(t, rec.Released)
	require.Equal(t, "create_order", rec.RecoveryPoint)

	w.before = nil
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, "create_order", res.ResumedFrom)
	require.Equal(t, 1, w.orders())
}

// swapBeforeTakeover gives acme's record to another workflow just before
// the takeover statement runs, as when the key was pruned and reused by
// another operation between the completer's read and its takeover. A claim
// takes its own connection first (so that a wait for the pool is not
// counted against its lease), so the swap happens when a connection is
// taken as well as when a claim goes through the pool.
type swapBeforeTakeover struct {
	*pgxpool.Pool
}

func (s swapBeforeTakeover) swap(ctx context.Context) error {
	_, err := s.Pool.Exec(ctx, `UPDATE onceflow_keys SET workflow = 'other' WHERE tenant_id = $1 AND key = $2`,
		acme.Tenant, acme.ID)
	return err
}

func (s swapBeforeTakeover) Acquire(ctx context.Context) (*pgxpool.Conn, error) {
	if err := s.swap(ctx); err != nil {
		return nil, err
	}
	return s.Pool.Acquire(ctx)
}

func (s swapBeforeTakeover) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if strings.Contains(sql, "WITH existing AS") {
		if err := s.swap(ctx); err != nil {
			return errRow{err}
		}
	}
	return s.Pool.QueryRow(ctx, sql, args...)
}

// TestResumeTakesOverOnlyItsWorkflow: a resume whose record now belongs to
// another workflow takes nothing over and changes nothing: it must not
// count a failed attempt against (and so perhaps fail) a record it cannot
// run.
//
// Before the fix, the takeover matched any workflow; the attempt then
// found the name wrong, released the other workflow's lease and counted an
// attempt against it.
func TestResumeTakesOverOnlyItsWorkflow(t *testing.T) {
	w := newWorld(t)
	w.before = func(_ context.Context, step string) error {
		if step == "charge" {
			return errors.New("provider down")
		}
		return nil
	}
	wf := w.checkout()
	e := w.engine(workflow.Config{})
	_, err := wf.Run(w.ctx, e, acme, order)
	require.Error(t, err)
	before, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)

	resumer, err := workflow.NewEngine(swapBeforeTakeover{w.db}, workflow.Config{Workflows: []workflow.Definition{wf}})
	require.NoError(t, err)
	_, err = resumer.Resume(w.ctx, acme)
	require.ErrorIs(t, err, workflow.ErrMismatch)
	after, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, "other", after.Workflow)
	require.Equal(t, before.Owner, after.Owner, "not taken over")
	require.Equal(t, before.Attempts, after.Attempts, "no attempt counted")
	require.Equal(t, before.LastError, after.LastError)
}
