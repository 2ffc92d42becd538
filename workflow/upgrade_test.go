package workflow_test

// Deploying a changed workflow while its records are in flight (issue 14):
// each rule of how an engine resumes, hands over or parks a record another
// definition wrote, against a real PostgreSQL. A record is written by v1,
// which dies at a crash point; then another definition meets it through a
// client's retry (Run) or the sweeper's path (Engine.Resume).

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// trail is the state of the versions' workflows: every step whose result
// is committed, as "version:step".
type trail struct {
	Ran []string `json:"ran"`
}

// answer is their response: the version that finished the record, and the
// trail.
type answer struct {
	Version string   `json:"version"`
	Ran     []string `json:"ran"`
}

// versions declares versions of one workflow, "order", and records what
// their steps do, across engines.
type versions struct {
	mu   sync.Mutex
	runs []string            // "version:step", every run of a step's function
	keys map[string][]string // foreign step → the downstream keys it was called with
}

// define declares version of "order" with steps written "name:A" (an
// atomic phase) or "name:F" (a foreign mutation). Each step adds itself to
// the state's trail; the response names version.
func (v *versions) define(version string, steps ...string) *workflow.Workflow[Order, trail] {
	ps := make([]phase.Step[Order, trail], len(steps))
	for i, s := range steps {
		name, kind, _ := strings.Cut(s, ":")
		mark := version + ":" + name
		if kind == "F" {
			ps[i] = foreign.Mutation(name, func(_ context.Context, c *foreign.Call[Order, trail]) error {
				v.ran(mark)
				v.mu.Lock()
				v.keys[name] = append(v.keys[name], c.Key)
				v.mu.Unlock()
				c.State.Ran = append(c.State.Ran, mark)
				return nil
			})
			continue
		}
		ps[i] = phase.Atomic(name, func(_ context.Context, _ pgx.Tx, r *phase.Run[Order, trail]) error {
			v.ran(mark)
			r.State.Ran = append(r.State.Ran, mark)
			return nil
		})
	}
	return workflow.Define("order", ps...).Version(version).Finish(func(s *trail) workflow.Response {
		return workflow.JSON(200, answer{Version: version, Ran: s.Ran})
	})
}

func (v *versions) ran(mark string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.runs = append(v.runs, mark)
}

// since returns the steps run after the first n runs.
func (v *versions) since(n int) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.runs[n:])
}

func (v *versions) count() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.runs)
}

func (v *versions) keysOf(step string) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.keys[step])
}

func newVersions() *versions { return &versions{keys: map[string][]string{}} }

// crashUnder runs wf for key on an engine that dies at point, and ends the
// dead attempt's lease, as time would.
func crashUnder[State any](w *world, wf *workflow.Workflow[Order, State], key workflow.Key, point workflow.CrashPoint) {
	w.t.Helper()
	e := w.engine(workflow.Config{Hooks: crashAt(point)})
	_, err := wf.Run(w.ctx, e, key, order)
	require.ErrorIs(w.t, err, workflow.ErrCrashed)
	require.NoError(w.t, e.Store().ExpireLease(w.ctx, key))
}

// record loads key's record.
func (w *world) record(key workflow.Key) *recovery.Record {
	w.t.Helper()
	rec, err := w.engine(workflow.Config{}).Store().Load(w.ctx, key)
	require.NoError(w.t, err)
	return rec
}

// requireAnswer checks that res is a response of version with trail ran.
func requireAnswer(t *testing.T, res *workflow.Result, version string, ran ...string) {
	t.Helper()
	require.Equal(t, 200, res.Response.Status, "%s", res.Response.Body)
	var got answer
	require.NoError(t, json.Unmarshal(res.Response.Body, &got))
	require.Equal(t, answer{Version: version, Ran: ran}, got)
}

// requireParked checks that err parks key for a definition change from
// version from to version to, and that the record is parked at point.
func requireParked(t *testing.T, w *world, err error, key workflow.Key, from, to, point string) {
	t.Helper()
	require.ErrorIs(t, err, workflow.ErrParked)
	var parked *recovery.ParkedError
	require.ErrorAs(t, err, &parked)
	require.Equal(t, key, parked.Key)
	require.Contains(t, parked.Reason, "version "+from)
	require.Contains(t, parked.Reason, "version "+to)
	requireStillParked(t, w, key, point)
}

// requireStillParked checks that key's record is parked at point: no
// lease, no response, no operator's choice.
func requireStillParked(t *testing.T, w *world, key workflow.Key, point string) {
	t.Helper()
	rec := w.record(key)
	require.Equal(t, recovery.StatusParked, rec.Status)
	require.Equal(t, point, rec.RecoveryPoint)
	require.Nil(t, rec.Response)
	require.Empty(t, rec.ResumeAs)
	require.Equal(t, 1, w.count(`SELECT count(*) FROM onceflow_keys
		WHERE tenant_id = $1 AND key = $2 AND status = 'parked' AND locked_until IS NULL`, key.Tenant, key.ID),
		"a parked record holds no lease")
}

// paths are the two ways a record meets a definition after a crash: the
// client's retry, and the sweeper's resume from the stored request.
var paths = []struct {
	name string
	run  func(w *world, e *workflow.Engine, wf *workflow.Workflow[Order, trail], key workflow.Key) (*workflow.Result, error)
}{
	{"retry", func(w *world, e *workflow.Engine, wf *workflow.Workflow[Order, trail], key workflow.Key) (*workflow.Result, error) {
		return wf.Run(w.ctx, e, key, order)
	}},
	{"resume", func(w *world, e *workflow.Engine, wf *workflow.Workflow[Order, trail], key workflow.Key) (*workflow.Result, error) {
		require.NoError(w.t, e.Register(wf))
		return e.Resume(w.ctx, key)
	}},
}

// v1Steps are the steps of v1, the definition that writes the records of
// most tests.
var v1Steps = []string{"create_order:A", "charge:F", "record_charge:A", "ship:A"}

// afterRecordCharge is where v1 dies in most tests: its recovery point is
// record_charge.
var afterRecordCharge = workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "record_charge"}

// TestUpgradeResumesAStepAddedAfterTheRecoveryPoint: v2 adds a step after
// v1's recovery point; it resumes v1's record, runs its own steps from
// there, answers, and stamps the record with its fingerprint.
func TestUpgradeResumesAStepAddedAfterTheRecoveryPoint(t *testing.T) {
	t.Parallel()
	for _, path := range paths {
		t.Run(path.name, func(t *testing.T) {
			w := newWorld(t)
			vs := newVersions()
			v1 := vs.define("v1", v1Steps...)
			v2 := vs.define("v2", "create_order:A", "charge:F", "record_charge:A", "receipt:A", "ship:A")
			crashUnder(w, v1, acme, afterRecordCharge)
			require.Equal(t, v1.Spec().Fingerprint, w.record(acme).Definition)
			ran := vs.count()

			res, err := path.run(w, w.engine(workflow.Config{}), v2, acme)
			require.NoError(t, err)
			require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
			require.Equal(t, "record_charge", res.ResumedFrom)
			requireAnswer(t, res, "v2", "v1:create_order", "v1:charge", "v1:record_charge", "v2:receipt", "v2:ship")
			require.Equal(t, []string{"v2:receipt", "v2:ship"}, vs.since(ran))
			rec := w.record(acme)
			require.Equal(t, recovery.StatusCompleted, rec.Status)
			require.Equal(t, v2.Spec().Fingerprint, rec.Definition, "the record is v2's now")
		})
	}
}

// TestUpgradeNeedsNoSecondConnection: right after a deploy, every retry of
// a record the old definition wrote reads that definition from the
// database. It reads it in the claim's transaction, on the connection the
// claim holds: were it to take another, a pool whose connections all hold
// such claims would wait for ever. A pool of one connection shows it.
func TestUpgradeNeedsNoSecondConnection(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	w := newWorldOn(t, url)
	vs := newVersions()
	v1 := vs.define("v1", v1Steps...)
	v2 := vs.define("v2", "create_order:A", "charge:F", "record_charge:A", "receipt:A", "ship:A")
	parks := vs.define("v2-parks", "create_order:A", "fraud_check:F", "charge:F", "record_charge:A", "ship:A")
	resumed, parked := workflow.Key{Tenant: "acme", ID: "resumed"}, workflow.Key{Tenant: "acme", ID: "parked"}
	crashUnder(w, v1, resumed, afterRecordCharge)
	crashUnder(w, v1, parked, afterRecordCharge)

	ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
	defer cancel()
	res, err := v2.Run(ctx, newEngine(t, dbtest.Connect(t, url, 1), workflow.Config{}), resumed, order)
	require.NoError(t, err)
	requireAnswer(t, res, "v2", "v1:create_order", "v1:charge", "v1:record_charge", "v2:receipt", "v2:ship")
	_, err = parks.Run(ctx, newEngine(t, dbtest.Connect(t, url, 1), workflow.Config{}), parked, order)
	requireParked(t, w, err, parked, "v1", "v2-parks", "record_charge")
}

// TestUpgradeParksAStepInsertedBeforeTheRecoveryPoint: v2 inserts a step
// before v1's recovery point, so it cannot tell what v1 did; it parks the
// record, runs nothing, logs and reports it, and every later retry or
// resume gets ErrParked without running anything.
func TestUpgradeParksAStepInsertedBeforeTheRecoveryPoint(t *testing.T) {
	t.Parallel()
	for _, path := range paths {
		t.Run(path.name, func(t *testing.T) {
			w := newWorld(t)
			vs := newVersions()
			v1 := vs.define("v1", v1Steps...)
			v2 := vs.define("v2", "create_order:A", "fraud_check:F", "charge:F", "record_charge:A", "ship:A")
			crashUnder(w, v1, acme, afterRecordCharge)
			ran := vs.count()

			logs, obs := &logRecords{}, &parkings{}
			e := w.engine(workflow.Config{Logger: slog.New(logs), Observer: obs})
			_, err := path.run(w, e, v2, acme)
			requireParked(t, w, err, acme, "v1", "v2", "record_charge")
			require.Empty(t, vs.since(ran), "v2 ran nothing")
			require.Equal(t, v1.Spec().Fingerprint, w.record(acme).Definition, "the record stays v1's")
			require.Equal(t, 1, obs.parked("order"))

			lines := logs.named("record parked")
			require.Len(t, lines, 1)
			require.Equal(t, slog.LevelWarn, lines[0].Level)
			attrs := attrsOf(lines[0])
			require.Equal(t, "v2", attrs["version"])
			require.Equal(t, v1.Spec().Fingerprint, attrs["recorded_definition"])
			require.Contains(t, attrs["reason"], "written by version v1, running version v2")
			require.Equal(t, "record_charge", attrs["recovery_point"])

			for _, again := range paths {
				_, err = again.run(w, e, v2, acme)
				requireParked(t, w, err, acme, "v1", "v2", "record_charge")
			}
			require.Empty(t, vs.since(ran), "nor did any retry")
			require.Equal(t, 1, obs.parked("order"), "parked once")
			require.Equal(t, 2, obs.claimed("order", workflow.ClaimParked), "each later claim found it parked")
			require.Len(t, logs.named("record parked"), 1)
		})
	}
}

// TestUpgradeParksAClaimCommittedAlone: a workflow that starts with a
// foreign step commits its claim on its own; parking then writes outside
// any transaction, and ends the lease all the same. v1 died after its first
// call, before any recovery point: that call may have been made, and v2
// inserts a step before it.
func TestUpgradeParksAClaimCommittedAlone(t *testing.T) {
	w := newWorld(t)
	vs := newVersions()
	v1 := vs.define("v1", "charge:F", "record_charge:A")
	v2 := vs.define("v2", "fraud_check:F", "charge:F", "record_charge:A")
	crashUnder(w, v1, acme, workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"})
	ran := vs.count()
	_, err := v2.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	requireParked(t, w, err, acme, "v1", "v2", "")
	require.ErrorContains(t, err, "may have started")
	_, err = v2.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	requireParked(t, w, err, acme, "v1", "v2", "")
	require.Empty(t, vs.since(ran))
}

// TestUpgradeRenamedForeignStepKeepsItsKey: a foreign step renamed with
// Renamed derives its downstream key from its first name, so a call v1 may
// have made before dying is made again under v2 with the same key; renamed
// without Renamed, the record parks.
func TestUpgradeRenamedForeignStepKeepsItsKey(t *testing.T) {
	w := newWorld(t)
	vs := newVersions()
	v1 := vs.define("v1", "create_order:A", "charge:F", "record_charge:A")
	afterCall := workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"}
	renamed := workflow.Key{Tenant: "acme", ID: "renamed"}
	crashUnder(w, v1, renamed, afterCall)
	require.Equal(t, "create_order", w.record(renamed).RecoveryPoint, "charge's call was made, its result not committed")
	keys := vs.keysOf("charge")
	require.Len(t, keys, 1)
	require.Equal(t, foreign.DeriveKey(renamed, w.record(renamed).ID, "charge"), keys[0])

	v2 := vs.define("v2", "create_order:A", "charge_card:F", "record_charge:A").
		Changes(workflow.Renamed("charge", "charge_card"))
	res, err := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}}).Resume(w.ctx, renamed)
	require.NoError(t, err)
	requireAnswer(t, res, "v2", "v1:create_order", "v2:charge_card", "v2:record_charge")
	require.Equal(t, keys, vs.keysOf("charge_card"), "the call is made again with v1's key")

	unrenamed := workflow.Key{Tenant: "acme", ID: "unrenamed"}
	crashUnder(w, v1, unrenamed, afterCall)
	ran := vs.count()
	silent := vs.define("v2-silent", "create_order:A", "charge_card:F", "record_charge:A")
	_, err = silent.Run(w.ctx, w.engine(workflow.Config{}), unrenamed, order)
	requireParked(t, w, err, unrenamed, "v1", "v2-silent", "create_order")
	require.Empty(t, vs.since(ran))
}

// TestUpgradeRenamedStepKeepsItsSubKeysAndCompensationKey: a step
// declared Renamed derives every downstream key from its first name, not
// only its own: the keys it derives for each of several calls
// (foreign.Call.KeyFor) and its compensation's key are the same before and
// after the rename, so that a per-item call made before the deploy is
// deduplicated after it, and the refund of a charge made before it is sent
// once, under the key it was always going to have, naming the charge's key.
func TestUpgradeRenamedStepKeepsItsSubKeysAndCompensationKey(t *testing.T) {
	w := newWorld(t)
	var (
		mu                 sync.Mutex
		items, undo, undid []string // KeyFor keys of the calls; the compensation's key, and the key it undoes
	)
	define := func(version, charge string, abort bool) *workflow.Workflow[Order, trail] {
		return workflow.Define("order",
			phase.Atomic("create_order", func(context.Context, pgx.Tx, *phase.Run[Order, trail]) error { return nil }),
			foreign.Mutation(charge, func(_ context.Context, c *foreign.Call[Order, trail]) error {
				mu.Lock()
				defer mu.Unlock()
				items = append(items, c.KeyFor("item", "1"), c.KeyFor("item", "2"))
				return nil
			}, foreign.Compensate(func(_ context.Context, c *foreign.Call[Order, trail]) error {
				mu.Lock()
				defer mu.Unlock()
				undo, undid = append(undo, c.Key), append(undid, c.Compensates)
				return nil
			})),
			phase.Atomic("record_charge", func(context.Context, pgx.Tx, *phase.Run[Order, trail]) error {
				if abort {
					return workflow.Abort(workflow.Problem(409, "the ledger refuses the charge"))
				}
				return nil
			}),
		).Version(version)
	}
	crashUnder(w, define("v1", "charge", false), acme, workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"})
	id := w.record(acme).ID
	before := []string{foreign.DeriveKey(acme, id, "charge", "item", "1"), foreign.DeriveKey(acme, id, "charge", "item", "2")}
	require.Equal(t, before, items, "v1's calls, one key per item")

	v2 := define("v2", "charge_card", true).Changes(workflow.Renamed("charge", "charge_card"))
	res, err := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}}).Resume(w.ctx, acme)
	require.NoError(t, err)
	require.True(t, res.Compensated, "record_charge aborted: the charge is undone")
	require.Equal(t, append(before, before...), items, "v2 repeats each item's call with v1's key")
	require.Equal(t, []string{foreign.DeriveKey(acme, id, "charge", "compensate")}, undo,
		"the refund's key derives from the step's first name")
	require.Equal(t, []string{foreign.DeriveKey(acme, id, "charge")}, undid, "the refund names the key the charge was made with")
}

// undoable declares version of "order" for TestUpgradeParksWhenWhatIsUndoneChanged:
// create_order, charge (foreign, refunded by a compensation when
// refundable), record_charge, and ship, which aborts the workflow when
// abortShip says so; noReturn, when set, is its point of no return. refunds
// counts the compensations run.
func undoable(version string, refundable, abortShip bool, noReturn string, refunds *atomic.Int32) *workflow.Workflow[Order, trail] {
	var opts []foreign.Option
	if refundable {
		opts = append(opts, foreign.Compensate(func(context.Context, *foreign.Call[Order, trail]) error {
			refunds.Add(1)
			return nil
		}))
	}
	noop := func(context.Context, pgx.Tx, *phase.Run[Order, trail]) error { return nil }
	wf := workflow.Define("order",
		phase.Atomic("create_order", noop),
		foreign.Mutation("charge", func(context.Context, *foreign.Call[Order, trail]) error { return nil }, opts...),
		phase.Atomic("record_charge", noop),
		phase.Atomic("ship", func(context.Context, pgx.Tx, *phase.Run[Order, trail]) error {
			if abortShip {
				return workflow.Abort(workflow.Problem(409, "the order cannot ship"))
			}
			return nil
		}),
	).Version(version)
	if noReturn != "" {
		wf.PointOfNoReturn(noReturn)
	}
	return wf
}

// TestUpgradeParksWhenWhatIsUndoneChanged: a deploy that changes what a
// terminal failure undoes, for what a record in flight may have done,
// parks the record instead of resuming it: a point of no return moved past
// a record that had passed it would refund a charge the old definition
// declared final, and a compensation dropped from a step the record did
// would leave unrefunded a charge the old definition would refund. A change
// after what the record did resumes it.
//
// Before, neither the point of no return nor a step's compensation was part
// of the definition: the new one took the record as its own and undid (or
// kept) what it liked.
func TestUpgradeParksWhenWhatIsUndoneChanged(t *testing.T) {
	t.Parallel()
	t.Run("point of no return moved past the record", func(t *testing.T) {
		w := newWorld(t)
		var refunds atomic.Int32
		crashUnder(w, undoable("v1", true, false, "record_charge", &refunds), acme, afterRecordCharge)
		v2 := undoable("v2", true, true, "ship", &refunds)
		_, err := v2.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
		requireParked(t, w, err, acme, "v1", "v2", "record_charge")
		require.ErrorContains(t, err, "point of no return")
		require.Zero(t, refunds.Load(), "a charge v1 declared final is not refunded")
	})
	t.Run("only the point of no return moved", func(t *testing.T) {
		// No version label, no step changed: the definitions differ by
		// their point of no return alone.
		w := newWorld(t)
		var refunds atomic.Int32
		v1 := undoable("", true, false, "record_charge", &refunds)
		crashUnder(w, v1, acme, afterRecordCharge)
		v2 := undoable("", true, true, "ship", &refunds)
		_, err := v2.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
		requireParked(t, w, err, acme, v1.Spec().Version, v2.Spec().Version, "record_charge")
		require.Zero(t, refunds.Load())
	})
	t.Run("compensation dropped from a step the record did", func(t *testing.T) {
		w := newWorld(t)
		var refunds atomic.Int32
		crashUnder(w, undoable("v1", true, false, "", &refunds), acme, afterRecordCharge)
		v2 := undoable("v2", false, true, "", &refunds)
		_, err := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}}).Resume(w.ctx, acme)
		requireParked(t, w, err, acme, "v1", "v2", "record_charge")
		require.ErrorContains(t, err, "compensation")
	})
	t.Run("point of no return moved after what the record did", func(t *testing.T) {
		w := newWorld(t)
		var refunds atomic.Int32
		crashUnder(w, undoable("v1", true, false, "record_charge", &refunds), acme,
			workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"})
		v2 := undoable("v2", true, true, "ship", &refunds)
		res, err := v2.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
		require.NoError(t, err)
		require.True(t, res.Compensated, "v2 resumed the record, and its abort undid the charge as v2 says")
		require.EqualValues(t, 1, refunds.Load())
	})
}

// stampedByAnOlderBuild makes key's record look as a build from before
// definitions recorded what they undo left it, under definition def: the
// record names def's earlier fingerprint, and the definition stored under it
// has no Compensation.
func stampedByAnOlderBuild(w *world, key workflow.Key, def workflow.Definition) {
	w.t.Helper()
	sp := def.Spec()
	legacy := sp
	legacy.Fingerprint, legacy.State, legacy.Earlier, legacy.Compensation = sp.Earlier.Fingerprint, sp.Earlier.State, nil, nil
	body, err := json.Marshal(legacy)
	require.NoError(w.t, err)
	_, err = w.db.Exec(w.ctx, `INSERT INTO onceflow_definitions (workflow, fingerprint, version, spec) VALUES ($1, $2, $3, $4)
		ON CONFLICT DO NOTHING`, sp.Workflow, legacy.Fingerprint, sp.Version, string(body))
	require.NoError(w.t, err)
	_, err = w.db.Exec(w.ctx, `UPDATE onceflow_keys SET definition = $3 WHERE tenant_id = $1 AND key = $2`,
		key.Tenant, key.ID, legacy.Fingerprint)
	require.NoError(w.t, err)
}

// TestUpgradeFromABuildThatDidNotRecordWhatIsUndone: what a definition
// undoes became part of its fingerprint, so every definition has a new
// one; a record an older build stamped with the definition's fingerprint
// of then (its earlier fingerprint) is still the same definition's. It
// resumes as its own (no state upgrade) and is restamped; a registered
// version finishes the records stamped with its earlier fingerprint; and a
// changed definition compares with the older build's stored definition
// without knowing what that undid, as before: it resumes what the rest of
// the rules let it.
func TestUpgradeFromABuildThatDidNotRecordWhatIsUndone(t *testing.T) {
	t.Parallel()
	t.Run("the same definition", func(t *testing.T) {
		w := newWorld(t)
		vs := newVersions()
		upgrades := 0
		v1 := vs.define("v1", "create_order:A", "charge:F", "record_charge:A").
			UpgradeState(func(old json.RawMessage) (trail, error) {
				upgrades++
				return trail{}, errors.New("not another definition's state")
			})
		crashUnder(w, v1, acme, workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"})
		stampedByAnOlderBuild(w, acme, v1)
		res, err := v1.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
		require.NoError(t, err)
		requireAnswer(t, res, "v1", "v1:create_order", "v1:charge", "v1:record_charge")
		require.Zero(t, upgrades, "the record's state is its own")
		require.Equal(t, v1.Spec().Fingerprint, w.record(acme).Definition, "restamped")
	})
	t.Run("a version registered with Versions", func(t *testing.T) {
		w := newWorld(t)
		vs := newVersions()
		v1 := vs.define("v1", "create_order:A", "charge:F", "record_charge:A")
		crashUnder(w, v1, acme, workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"})
		stampedByAnOlderBuild(w, acme, v1)
		v2 := vs.define("v2", "create_order:A", "fraud_check:F", "charge:F", "record_charge:A")
		e := w.engine(workflow.Config{Workflows: []workflow.Definition{workflow.Versions(v1, v2)}})
		res, err := v2.Run(w.ctx, e, acme, order)
		require.NoError(t, err)
		requireAnswer(t, res, "v1", "v1:create_order", "v1:charge", "v1:record_charge")
	})
	t.Run("a definition changed after the recovery point", func(t *testing.T) {
		w := newWorld(t)
		var refunds atomic.Int32
		v1 := undoable("v1", true, false, "record_charge", &refunds)
		crashUnder(w, v1, acme, afterRecordCharge)
		stampedByAnOlderBuild(w, acme, v1)
		// It adds a step and drops the point of no return, so it would
		// refund the charge: what v1 undid is not known, so only the steps
		// are compared, as before.
		v2 := workflow.Define("order", phase.Atomic("create_order", noopPhase),
			foreign.Mutation("charge", noopCall, foreign.Compensate(noopCall)),
			phase.Atomic("record_charge", noopPhase), phase.Atomic("ship", noopPhase), phase.Atomic("notify", noopPhase)).Version("v2")
		_, err := v2.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
		require.NoError(t, err)
		require.Equal(t, v2.Spec().Fingerprint, w.record(acme).Definition)
	})
}

func noopPhase(context.Context, pgx.Tx, *phase.Run[Order, trail]) error { return nil }
func noopCall(context.Context, *foreign.Call[Order, trail]) error       { return nil }

// TestUpgradeRemovedStep: a step Removed after the recovery point is
// skipped when it cannot have started (an atomic one), and parks the record
// when it may have (the foreign step right after the recovery point).
func TestUpgradeRemovedStep(t *testing.T) {
	t.Parallel()
	t.Run("atomic step after the recovery point", func(t *testing.T) {
		w := newWorld(t)
		vs := newVersions()
		v1 := vs.define("v1", "create_order:A", "audit:A", "charge:F", "record_charge:A")
		crashUnder(w, v1, acme, workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"})
		ran := vs.count()
		v2 := vs.define("v2", "create_order:A", "charge:F", "record_charge:A").Changes(workflow.Removed("audit"))
		res, err := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}}).Resume(w.ctx, acme)
		require.NoError(t, err)
		requireAnswer(t, res, "v2", "v1:create_order", "v2:charge", "v2:record_charge")
		require.Equal(t, []string{"v2:charge", "v2:record_charge"}, vs.since(ran))
	})
	t.Run("the steps after the recovery point", func(t *testing.T) {
		w := newWorld(t)
		vs := newVersions()
		v1 := vs.define("v1", "create_order:A", "charge:F", "record_charge:A", "audit:A")
		crashUnder(w, v1, acme, afterRecordCharge)
		ran := vs.count()
		v2 := vs.define("v2", "create_order:A", "charge:F", "record_charge:A").Changes(workflow.Removed("audit"))
		res, err := v2.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
		require.NoError(t, err, "every step is committed: v2 answers from the state")
		requireAnswer(t, res, "v2", "v1:create_order", "v1:charge", "v1:record_charge")
		require.Empty(t, vs.since(ran))
		require.Equal(t, recovery.StatusCompleted, w.record(acme).Status)
	})
	t.Run("foreign step right after the recovery point", func(t *testing.T) {
		w := newWorld(t)
		vs := newVersions()
		v1 := vs.define("v1", "create_order:A", "charge:F", "record_charge:A")
		crashUnder(w, v1, acme, workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"})
		ran := vs.count()
		v2 := vs.define("v2", "create_order:A", "record_charge:A").Changes(workflow.Removed("charge"))
		_, err := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}}).Resume(w.ctx, acme)
		requireParked(t, w, err, acme, "v1", "v2", "create_order")
		require.ErrorContains(t, err, "step charge, which version v2 removes, may have started")
		require.Empty(t, vs.since(ran))
	})
}

// TestVersionsFinishRecordsUnderTheirOwnDefinition: with Versions(v1, v2)
// registered, a record v1 wrote is finished by v1, whether v2's Run meets
// it (it hands the record over) or the engine resumes it; a new key runs
// v2.
func TestVersionsFinishRecordsUnderTheirOwnDefinition(t *testing.T) {
	t.Parallel()
	for _, path := range paths {
		t.Run(path.name, func(t *testing.T) {
			w := newWorld(t)
			vs := newVersions()
			v1 := vs.define("v1", "create_order:A", "charge:F", "record_charge:A")
			// v2 could resume v1's records itself: only Versions keeps them v1's.
			v2 := vs.define("v2", "create_order:A", "charge:F", "record_charge:A", "receipt:A")
			crashUnder(w, v1, acme, workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"})
			ran := vs.count()

			e := w.engine(workflow.Config{Workflows: []workflow.Definition{workflow.Versions(v1, v2)}})
			res, err := path.run(w, e, v2, acme)
			require.NoError(t, err)
			requireAnswer(t, res, "v1", "v1:create_order", "v1:charge", "v1:record_charge")
			require.Equal(t, []string{"v1:charge", "v1:record_charge"}, vs.since(ran), "v1's steps, not v2's")
			rec := w.record(acme)
			require.Equal(t, v1.Spec().Fingerprint, rec.Definition)
			require.Equal(t, 1, rec.Attempts, "the crash counts; the hand-over does not")

			fresh := workflow.Key{Tenant: "acme", ID: "fresh"}
			res, err = v2.Run(w.ctx, e, fresh, order)
			require.NoError(t, err)
			requireAnswer(t, res, "v2", "v2:create_order", "v2:charge", "v2:record_charge", "v2:receipt")
			require.Equal(t, v2.Spec().Fingerprint, w.record(fresh).Definition)
		})
	}
}

// TestVersionsHandOverAClaimCommittedAlone: when v2's claim commits on its
// own (its first step is foreign), v2 hands the lease back for v1 to take
// over, without counting an attempt; v1 repeats the call that may have
// been made, with its key.
func TestVersionsHandOverAClaimCommittedAlone(t *testing.T) {
	w := newWorld(t)
	vs := newVersions()
	v1 := vs.define("v1", "charge:F", "record_charge:A")
	v2 := vs.define("v2", "charge:F", "record_charge:A", "receipt:A")
	crashUnder(w, v1, acme, workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"})
	require.Empty(t, w.record(acme).RecoveryPoint)
	ran := vs.count()

	e := w.engine(workflow.Config{Workflows: []workflow.Definition{workflow.Versions(v1, v2)}})
	res, err := v2.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	requireAnswer(t, res, "v1", "v1:charge", "v1:record_charge")
	require.Equal(t, []string{"v1:charge", "v1:record_charge"}, vs.since(ran))
	keys := vs.keysOf("charge")
	require.Len(t, keys, 2)
	require.Equal(t, keys[0], keys[1])
	require.Equal(t, 1, w.record(acme).Attempts, "the crash counts; the hand-over does not")
}

// Shapes of one invoice's state before and after v2 (TestUpgradeState).
type (
	centsState struct {
		Cents int64 `json:"cents"`
	}
	money struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
	}
	totalState struct {
		Total money `json:"total"`
	}
)

// TestUpgradeState: v2 stores its state in another shape; its upgrader
// reads the state v1 committed, the upgraded state is committed with v2's
// fingerprint before v2's next step, and a later attempt of v2 reads it as
// its own, without the upgrader.
func TestUpgradeState(t *testing.T) {
	w := newWorld(t)
	v1 := workflow.Define("invoice",
		phase.Atomic("price", func(_ context.Context, _ pgx.Tx, r *phase.Run[Order, centsState]) error {
			r.State.Cents = r.Request.Amount
			return nil
		}),
		phase.Atomic("bill", func(context.Context, pgx.Tx, *phase.Run[Order, centsState]) error { return nil }),
	).Version("v1")
	var upgrades int
	v2 := workflow.Define("invoice",
		phase.Atomic("price", func(_ context.Context, _ pgx.Tx, r *phase.Run[Order, totalState]) error {
			r.State.Total = money{Amount: r.Request.Amount, Currency: "EUR"}
			return nil
		}),
		phase.Atomic("bill", func(_ context.Context, _ pgx.Tx, r *phase.Run[Order, totalState]) error {
			if r.State.Total.Currency == "" {
				return errors.New("bill without a total")
			}
			return nil
		}),
	).Version("v2").UpgradeState(func(old json.RawMessage) (totalState, error) {
		upgrades++
		var s centsState
		if err := json.Unmarshal(old, &s); err != nil {
			return totalState{}, err
		}
		return totalState{Total: money{Amount: s.Cents, Currency: "EUR"}}, nil
	})
	crashUnder(w, v1, acme, workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "price"})
	stored := func() string {
		var s string
		require.NoError(t, w.db.QueryRow(w.ctx, `SELECT state::text FROM onceflow_keys WHERE key = $1`, acme.ID).Scan(&s))
		return s
	}
	require.JSONEq(t, `{"cents":1999}`, stored())

	crashUnder(w, v2, acme, workflow.CrashPoint{Kind: workflow.BeforeStep, Step: "bill"})
	require.Equal(t, 1, upgrades)
	require.JSONEq(t, `{"total":{"amount":1999,"currency":"EUR"}}`, stored(), "the upgraded state is committed")
	require.Equal(t, v2.Spec().Fingerprint, w.record(acme).Definition)

	res, err := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}}).Resume(w.ctx, acme)
	require.NoError(t, err)
	require.JSONEq(t, `{"total":{"amount":1999,"currency":"EUR"}}`, string(res.Response.Body))
	require.Equal(t, 1, upgrades, "v2's own state is not upgraded again")
}

// TestResumeAs: an operator resumes a parked record under a registered
// version of their choice, from its recovery point, without comparing
// definitions; what cannot run it is refused and leaves it parked.
func TestResumeAs(t *testing.T) {
	w := newWorld(t)
	vs := newVersions()
	v1 := vs.define("v1", v1Steps...)
	v2 := vs.define("v2", "create_order:A", "fraud_check:F", "charge:F", "record_charge:A", "ship:A")
	v3 := vs.define("v3", "create_order:A", "charge:F", "settle:A", "ship:A")
	first, second := workflow.Key{Tenant: "acme", ID: "first"}, workflow.Key{Tenant: "acme", ID: "second"}
	for _, key := range []workflow.Key{first, second} {
		crashUnder(w, v1, key, afterRecordCharge)
		_, err := v2.Run(w.ctx, w.engine(workflow.Config{}), key, order)
		requireParked(t, w, err, key, "v1", "v2", "record_charge")
	}
	inFlight := workflow.Key{Tenant: "acme", ID: "in-flight"}
	crashUnder(w, v1, inFlight, afterRecordCharge)
	ran := vs.count()

	ops := w.engine(workflow.Config{Workflows: []workflow.Definition{workflow.Versions(v1, v3, v2)}})
	_, err := ops.ResumeAs(w.ctx, first, "v9")
	require.ErrorIs(t, err, workflow.ErrUnknownWorkflow)
	_, err = ops.ResumeAs(w.ctx, first, "v3")
	require.ErrorIs(t, err, workflow.ErrInvalidInput, "v3 has no step record_charge")
	require.ErrorContains(t, err, "record_charge")
	_, err = ops.ResumeAs(w.ctx, inFlight, "v2")
	require.ErrorIs(t, err, workflow.ErrNotParked)
	requireStillParked(t, w, first, "record_charge")
	require.Empty(t, vs.since(ran))

	res, err := ops.ResumeAs(w.ctx, first, "v2")
	require.NoError(t, err)
	requireAnswer(t, res, "v2", "v1:create_order", "v1:charge", "v1:record_charge", "v2:ship")
	require.Equal(t, []string{"v2:ship"}, vs.since(ran), "from the recovery point: fraud_check does not run")
	rec := w.record(first)
	require.Equal(t, recovery.StatusCompleted, rec.Status)
	require.Equal(t, v2.Spec().Fingerprint, rec.Definition)
	require.Empty(t, rec.ResumeAs, "the choice is spent")
	_, err = ops.ResumeAs(w.ctx, first, "v2")
	require.ErrorIs(t, err, workflow.ErrNotParked)

	ran = vs.count()
	res, err = ops.ResumeAs(w.ctx, second, v1.Spec().Fingerprint)
	require.NoError(t, err)
	requireAnswer(t, res, "v1", "v1:create_order", "v1:charge", "v1:record_charge", "v1:ship")
	require.Equal(t, []string{"v1:ship"}, vs.since(ran), "an older version, named by its fingerprint")
	require.Equal(t, v1.Spec().Fingerprint, w.record(second).Definition)
}

// TestResumeAsTwiceAtOnceRunsOnce: two operators resume one parked record
// at once, both having read it parked: one resumes it, the other gets
// ErrLeaseLost, and its steps run once. Both are held at their write by a
// lock on the row until both wait there.
func TestResumeAsTwiceAtOnceRunsOnce(t *testing.T) {
	w := newWorld(t)
	vs := newVersions()
	v1 := vs.define("v1", v1Steps...)
	v2 := vs.define("v2", "create_order:A", "fraud_check:F", "charge:F", "record_charge:A", "ship:A")
	crashUnder(w, v1, acme, afterRecordCharge)
	_, err := v2.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	requireParked(t, w, err, acme, "v1", "v2", "record_charge")
	ran := vs.count()

	lock, err := w.db.Begin(w.ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(w.ctx) }()
	_, err = lock.Exec(w.ctx, `SELECT 1 FROM onceflow_keys WHERE key = $1 FOR UPDATE`, acme.ID)
	require.NoError(t, err)

	type outcome struct {
		res *workflow.Result
		err error
	}
	done := make(chan outcome, 2)
	for range 2 {
		ops := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}})
		go func() {
			res, err := ops.ResumeAs(w.ctx, acme, "v2")
			done <- outcome{res, err}
		}()
	}
	require.Eventually(t, func() bool {
		return w.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%resume_as = $4%'`) == 2
	}, 10*time.Second, time.Millisecond, "both operators read the record parked and wait to write")
	require.NoError(t, lock.Commit(w.ctx))

	var won, lost int
	for range 2 {
		select {
		case o := <-done:
			if o.err != nil {
				require.ErrorIs(t, o.err, workflow.ErrLeaseLost)
				lost++
				continue
			}
			requireAnswer(t, o.res, "v2", "v1:create_order", "v1:charge", "v1:record_charge", "v2:ship")
			won++
		case <-time.After(10 * time.Second):
			t.Fatal("a ResumeAs did not return")
		}
	}
	require.Equal(t, 1, won)
	require.Equal(t, 1, lost)
	require.Equal(t, []string{"v2:ship"}, vs.since(ran), "run once")
}

// TestLegacyRecordResumesAsBefore: a record made before definitions were
// stored (definition NULL) is not compared with anything: it resumes by
// its recovery point's name, as before migration 0010, under whichever
// definition meets it, and is stamped with that definition's fingerprint.
func TestLegacyRecordResumesAsBefore(t *testing.T) {
	w := newWorld(t)
	vs := newVersions()
	v1 := vs.define("v1", "create_order:A", "charge:F", "record_charge:A")
	same, changed := workflow.Key{Tenant: "acme", ID: "same"}, workflow.Key{Tenant: "acme", ID: "changed"}
	for _, key := range []workflow.Key{same, changed} {
		crashUnder(w, v1, key, workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"})
	}
	_, err := w.db.Exec(w.ctx, `UPDATE onceflow_keys SET definition = NULL`)
	require.NoError(t, err)
	ran := vs.count()

	res, err := v1.Run(w.ctx, w.engine(workflow.Config{}), same, order)
	require.NoError(t, err)
	requireAnswer(t, res, "v1", "v1:create_order", "v1:charge", "v1:record_charge")
	require.Equal(t, v1.Spec().Fingerprint, w.record(same).Definition)

	// A definition that would park a record v1 stamped.
	v2 := vs.define("v2", "create_order:A", "fraud_check:F", "charge:F", "record_charge:A")
	res, err = w.engine(workflow.Config{Workflows: []workflow.Definition{v2}}).Resume(w.ctx, changed)
	require.NoError(t, err)
	requireAnswer(t, res, "v2", "v1:create_order", "v2:fraud_check", "v2:charge", "v2:record_charge")
	require.Equal(t, v2.Spec().Fingerprint, w.record(changed).Definition)
	require.Equal(t, []string{"v1:charge", "v1:record_charge", "v2:fraud_check", "v2:charge", "v2:record_charge"}, vs.since(ran))
}

// TestRegisterVersions: one name, two definitions, only through Versions.
func TestRegisterVersions(t *testing.T) {
	w := newWorld(t)
	vs := newVersions()
	v1 := vs.define("v1", "create_order:A", "charge:F")
	v2 := vs.define("v2", "create_order:A", "charge:F", "record_charge:A")

	e := w.engine(workflow.Config{Workflows: []workflow.Definition{v1}})
	require.ErrorIs(t, e.Register(v2), workflow.ErrInvalidInput)
	_, err := v2.Run(w.ctx, e, acme, order)
	require.ErrorIs(t, err, workflow.ErrInvalidInput)
	require.ErrorContains(t, err, "workflow.Versions")
	require.Zero(t, w.keys(), "nothing claimed")
	require.Zero(t, vs.count())
	_, err = workflow.NewEngine(w.db, workflow.Config{Workflows: []workflow.Definition{v1, v2}})
	require.ErrorIs(t, err, workflow.ErrInvalidInput)

	twin := vs.define("v1", "create_order:A", "charge:F")
	require.ErrorIs(t, e.Register(twin), workflow.ErrInvalidInput, "the same version declared twice")

	require.NoError(t, e.Register(workflow.Versions(v1, v2)))
	require.NoError(t, e.Register(v1), "a registered version again")
	_, err = v2.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, v2.Spec().Fingerprint, w.record(acme).Definition)

	other := workflow.Define("refund", phase.Atomic("refund", func(context.Context, pgx.Tx, *phase.Run[Order, trail]) error { return nil }))
	mixed := panicOf(t, func() { workflow.Versions(v1, other) })
	require.ErrorIs(t, mixed, workflow.ErrInvalidInput)
	require.ErrorContains(t, mixed, "must be of one workflow")
	require.ErrorIs(t, panicOf(t, func() { workflow.Versions(v1, twin) }), workflow.ErrInvalidInput, "one version twice")
}

// TestRollingDeploy: v1 and v2 (a step added after charge) run side by
// side. A record v2 took over and restamped goes back to v1 when v2 dies:
// v1 resumes it when it is not past what v1 knows, and parks it when v2
// committed the step v1 lacks.
func TestRollingDeploy(t *testing.T) {
	w := newWorld(t)
	vs := newVersions()
	v1 := vs.define("v1", "create_order:A", "charge:F", "record_charge:A")
	v2 := vs.define("v2", "create_order:A", "charge:F", "receipt:A", "record_charge:A")
	afterCreate := workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"}
	oldEngine := w.engine(workflow.Config{Workflows: []workflow.Definition{v1}})

	// v2's sweeper (which never ran a request) takes the record over and
	// dies after the charge's call, before receipt commits it.
	before := workflow.Key{Tenant: "acme", ID: "before-receipt"}
	crashUnder(w, v1, before, afterCreate)
	sweeper := w.engine(workflow.Config{Workflows: []workflow.Definition{v2},
		Hooks: crashAt(workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"})})
	_, err := sweeper.Resume(w.ctx, before)
	require.ErrorIs(t, err, workflow.ErrCrashed)
	require.NoError(t, sweeper.Store().ExpireLease(w.ctx, before))
	rec := w.record(before)
	require.Equal(t, v2.Spec().Fingerprint, rec.Definition, "v2 restamped it")
	require.Equal(t, "create_order", rec.RecoveryPoint)
	ran := vs.count()
	res, err := oldEngine.Resume(w.ctx, before)
	require.NoError(t, err, "v1 knows every step v2 may have done")
	requireAnswer(t, res, "v1", "v1:create_order", "v1:charge", "v1:record_charge")
	require.Equal(t, []string{"v1:charge", "v1:record_charge"}, vs.since(ran))
	require.Equal(t, v1.Spec().Fingerprint, w.record(before).Definition)
	keys := vs.keysOf("charge")
	require.Len(t, keys, 2)
	require.Equal(t, keys[0], keys[1], "v1 repeats v2's call with its key")

	// A retry lands on v2, which dies after committing receipt.
	after := workflow.Key{Tenant: "acme", ID: "after-receipt"}
	crashUnder(w, v1, after, afterCreate)
	crashUnder(w, v2, after, workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "receipt"})
	rec = w.record(after)
	require.Equal(t, v2.Spec().Fingerprint, rec.Definition)
	require.Equal(t, "receipt", rec.RecoveryPoint)
	ran = vs.count()
	_, err = v1.Run(w.ctx, oldEngine, after, order)
	requireParked(t, w, err, after, "v2", "v1", "receipt")
	_, err = oldEngine.Resume(w.ctx, after)
	requireParked(t, w, err, after, "v2", "v1", "receipt")
	require.Empty(t, vs.since(ran), "v1 runs nothing past a step it lacks")
}

// panicOf returns what fn panics with, which must be an error.
func panicOf(t *testing.T, fn func()) (err error) {
	t.Helper()
	defer func() {
		v := recover()
		require.NotNil(t, v, "no panic")
		require.Implements(t, (*error)(nil), v)
		err = v.(error)
	}()
	fn()
	return nil
}

// logRecords is a slog.Handler that keeps every record.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}

// named returns the records whose message starts with prefix.
func (l *logRecords) named(prefix string) []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []slog.Record
	for _, r := range l.recs {
		if strings.HasPrefix(r.Message, prefix) {
			out = append(out, r)
		}
	}
	return out
}

func attrsOf(r slog.Record) map[string]string {
	attrs := map[string]string{}
	r.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.String()
		return true
	})
	return attrs
}

// parkings is an Observer that counts parked records and claim outcomes.
type parkings struct {
	workflow.NopObserver
	mu     sync.Mutex
	parks  map[string]int
	claims map[string]int // workflow + " " + outcome
}

func (p *parkings) Claimed(workflow, outcome string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.claims == nil {
		p.claims = map[string]int{}
	}
	p.claims[workflow+" "+outcome]++
}
func (p *parkings) Parked(workflow string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.parks == nil {
		p.parks = map[string]int{}
	}
	p.parks[workflow]++
}

func (p *parkings) parked(workflow string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.parks[workflow]
}

func (p *parkings) claimed(workflow, outcome string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.claims[workflow+" "+outcome]
}

// TestUpgradeRenamedRecoveryPoint: a record whose recovery point was
// renamed resumes after the new name, reports it in ResumedFrom and stores
// it; an operator's ResumeAs follows the chosen version's Renamed too.
func TestUpgradeRenamedRecoveryPoint(t *testing.T) {
	w := newWorld(t)
	vs := newVersions()
	v1 := vs.define("v1", "create_order:A", "charge:F", "record_charge:A")
	afterCreate := workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"}
	key := workflow.Key{Tenant: "acme", ID: "renamed-point"}
	crashUnder(w, v1, key, afterCreate)

	v2 := vs.define("v2", "make_order:A", "charge:F", "record_charge:A").
		Changes(workflow.Renamed("create_order", "make_order"))
	res, err := v2.Run(w.ctx, w.engine(workflow.Config{}), key, order)
	require.NoError(t, err)
	require.Equal(t, "make_order", res.ResumedFrom)
	requireAnswer(t, res, "v2", "v1:create_order", "v2:charge", "v2:record_charge")

	parked := workflow.Key{Tenant: "acme", ID: "renamed-point-parked"}
	crashUnder(w, v1, parked, afterCreate)
	silent := vs.define("v3", "make_order:A", "screen:F", "charge:F", "record_charge:A")
	_, err = silent.Run(w.ctx, w.engine(workflow.Config{}), parked, order)
	require.ErrorIs(t, err, workflow.ErrParked)
	res, err = w.engine(workflow.Config{Workflows: []workflow.Definition{v2}}).ResumeAs(w.ctx, parked, "v2")
	require.NoError(t, err, "v2 renames create_order, the record's recovery point")
	require.Equal(t, "make_order", res.ResumedFrom)
	requireAnswer(t, res, "v2", "v1:create_order", "v2:charge", "v2:record_charge")
}
