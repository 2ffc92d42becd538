package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// Adversarial tests of deploying a changed workflow while records are in
// flight: each drives a sequence of versions, crashes and operator actions
// that once repeated an effect, skipped one, or left a record looping.

// payFlow declares workflow "pay" with explicit version (none when "")
// and steps written "name:A" (an atomic phase writing a ledger row
// "key/name"), or "name:F@endpoint" (after w.before, a call to the
// provider's endpoint with the step's derived key; the endpoint is the
// effect, so a renamed step keeps it). The charge's id goes in the state,
// and an atomic step named record_charge adds it to its ledger row.
func (w *world) payFlow(version string, steps ...string) *workflow.Workflow[Order, Paid] {
	var ps []phase.Step[Order, Paid]
	for _, s := range steps {
		name, kind, _ := strings.Cut(s, ":")
		if endpoint, ok := strings.CutPrefix(kind, "F@"); ok {
			ps = append(ps, foreign.Mutation(name, func(ctx context.Context, c *foreign.Call[Order, Paid]) error {
				if err := w.step(ctx, c.Run.Step); err != nil {
					return err
				}
				id, err := testapp.Call(ctx, w.provider.URL, endpoint, c.Key)
				c.State.ChargeID = id
				return err
			}))
			continue
		}
		ps = append(ps, phase.Atomic(name, func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			entry := r.Key.ID + "/" + r.Step
			if r.Step == "record_charge" {
				entry += " " + r.State.ChargeID
			}
			_, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, entry) VALUES (0, $1)`, entry)
			return err
		}))
	}
	return workflow.Define("pay", ps...).Version(version)
}

// crashIn runs wf under key on an engine that stops at point, as a process
// death would, and ends the dead attempt's lease.
func (w *world) crashIn(wf workflow.Definition, run func(e *workflow.Engine) error, point workflow.CrashPoint, key workflow.Key) {
	w.t.Helper()
	e := w.engine(workflow.Config{Workflows: []workflow.Definition{wf}, Hooks: crashAt(point)})
	require.ErrorIs(w.t, run(e), workflow.ErrCrashed)
	require.NoError(w.t, e.Store().ExpireLease(w.ctx, key))
}

func (w *world) load(key workflow.Key) *recovery.Record {
	w.t.Helper()
	rec, err := w.engine(workflow.Config{}).Store().Load(w.ctx, key)
	require.NoError(w.t, err)
	return rec
}

// TestUpgradeAttackDroppedRenameKeepsDerivedKeys: version 2 renamed charge
// to charge_card and declared it, so a record it made derives the call's
// key from "charge". A later definition drops the declaration, as the docs
// allowed once records written under the old name were gone. A record
// version 2 made, stopped after its call may have been made, must not be
// charged again under another key: the later definition parks it (with or
// without an explicit version; without one the two definitions once had
// one fingerprint and nothing was compared), and the deploy check says so.
func TestUpgradeAttackDroppedRenameKeepsDerivedKeys(t *testing.T) {
	w := newWorld(t)
	for i, version := range []string{"", "3"} {
		key := workflow.Key{Tenant: "acme", ID: "order-" + version}
		v2 := w.payFlow("", "create_order:A", "charge_card:F@charges", "record_charge:A").
			Changes(workflow.Renamed("charge", "charge_card"))
		w.crashIn(v2, func(e *workflow.Engine) error { _, err := v2.Run(w.ctx, e, key, order); return err },
			workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge_card"}, key)
		require.Equal(t, i+1, w.provider.Effects("charges"))

		v3 := w.payFlow(version, "create_order:A", "charge_card:F@charges", "record_charge:A")
		_, err := w.engine(workflow.Config{Workflows: []workflow.Definition{v3}}).Resume(w.ctx, key)
		require.ErrorIs(t, err, workflow.ErrParked, "version %q", version)
		require.Equal(t, i+1, w.provider.Effects("charges"), "version %q: one charge per record", version)
		require.NotEmpty(t, workflow.Diff([]workflow.Spec{v2.Spec()}, []workflow.Spec{v3.Spec()}),
			"version %q: the deploy check sees the change of key", version)
	}
}

// TestUpgradeAttackTwoRenamesIntoOneStep: Renamed("a", "c") with
// Renamed("b", "c") left the step's first name to map iteration order, so
// one attempt derived its key from "a" and the next from "b". A definition
// must name one history per step.
func TestUpgradeAttackTwoRenamesIntoOneStep(t *testing.T) {
	w := newWorld(t)
	require.Panics(t, func() {
		w.payFlow("", "create_order:A", "c:F@charges").Changes(workflow.Renamed("a", "c"), workflow.Renamed("b", "c"))
	})
	chain := w.payFlow("", "create_order:A", "c:F@charges").Changes(workflow.Renamed("a", "b"), workflow.Renamed("b", "c"))
	require.Equal(t, "a", chain.Spec().Steps[1].Key, "a chain derives from its first name")
}

// TestUpgradeAttackResumeStoresItsDefinition: a process that only resumes
// (a sweeper, Engine.Resume) and never ran its definition stamped records
// with a fingerprint it had not stored. In a rolling deploy, the version 1
// process that took such a record over next could not read the definition
// that wrote it, and parked a record it could resume.
func TestUpgradeAttackResumeStoresItsDefinition(t *testing.T) {
	w := newWorld(t)
	v1 := w.payFlow("1", "create_order:A", "charge:F@charges", "record_charge:A")
	v2 := w.payFlow("2", "create_order:A", "charge:F@charges", "record_charge:A", "receipt:F@receipts")
	w.crashIn(v1, func(e *workflow.Engine) error { _, err := v1.Run(w.ctx, e, acme, order); return err },
		workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"}, acme)

	// Version 2's sweeper takes the record over and dies in the charge.
	w.crashIn(v2, func(e *workflow.Engine) error { _, err := e.Resume(w.ctx, acme); return err },
		workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"}, acme)
	rec := w.load(acme)
	require.Equal(t, v2.Spec().Fingerprint, rec.Definition)
	stored, err := w.engine(workflow.Config{}).Store().Definitions(w.ctx, "pay", rec.Definition)
	require.NoError(t, err)
	require.Len(t, stored, 1, "the definition a record is stamped with is stored")

	// A version 1 process resumes it: what version 2 may have done (the
	// charge) is version 1's too.
	res, err := w.engine(workflow.Config{Workflows: []workflow.Definition{v1}}).Resume(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, 200, res.Response.Status)
	require.Equal(t, 1, w.provider.Effects("charges"))
}

// TestUpgradeAttackUnreadableStoredDefinition: a stored definition that
// cannot be read (a step kind this build does not know) failed every
// attempt, so the completer resumed the record again and again (for ever
// with MaxAttempts -1); one that reads as no steps at all let a changed
// first foreign step run under a new key. Both park: nothing is known of
// what the record may have done.
func TestUpgradeAttackUnreadableStoredDefinition(t *testing.T) {
	w := newWorld(t)
	for i, corrupt := range []string{
		`replace(spec::text, '"atomic"', '"saga"')::json`,
		`'{}'::json`,
	} {
		key := workflow.Key{Tenant: "acme", ID: "order-" + string(rune('a'+i))}
		v1 := w.payFlow("1", "charge:F@charges", "record_charge:A")
		w.crashIn(v1, func(e *workflow.Engine) error { _, err := v1.Run(w.ctx, e, key, order); return err },
			workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"}, key)
		_, err := w.db.Exec(w.ctx, `UPDATE onceflow_definitions SET spec = `+corrupt+` WHERE version = '1'`)
		require.NoError(t, err)

		v2 := w.payFlow("2", "pay:F@charges", "record_charge:A")
		e := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}, MaxAttempts: -1})
		_, err = e.Resume(w.ctx, key)
		require.ErrorIs(t, err, workflow.ErrParked, corrupt)
		rec := w.load(key)
		require.Equal(t, recovery.StatusParked, rec.Status, corrupt)
		require.Equal(t, 1, rec.Attempts, "%s: only the crash counts", corrupt)
		require.Equal(t, i+1, w.provider.Effects("charges"), corrupt)
		_, err = w.db.Exec(w.ctx, `DELETE FROM onceflow_definitions`)
		require.NoError(t, err)
	}
}

// TestUpgradeAttackLegacyRecord: a record claimed before migration 0010
// has no definition. Its recovery point named a step the running
// definition renamed (and declared), or dropped: each attempt failed, the
// completer resumed it again, and after MaxAttempts the key stored a 500
// although its order was made and its card charged. A declared rename
// resumes it; a point that is no step parks it.
func TestUpgradeAttackLegacyRecord(t *testing.T) {
	w := newWorld(t)
	v1 := w.payFlow("", "create_order:A", "charge:F@charges", "record_charge:A")
	legacy := func(key workflow.Key) {
		w.crashIn(v1, func(e *workflow.Engine) error { _, err := v1.Run(w.ctx, e, key, order); return err },
			workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"}, key)
		_, err := w.db.Exec(w.ctx, `UPDATE onceflow_keys SET definition = NULL WHERE key = $1`, key.ID)
		require.NoError(t, err)
	}

	renamed := workflow.Key{Tenant: "acme", ID: "renamed"}
	legacy(renamed)
	v2 := w.payFlow("", "make_order:A", "charge:F@charges", "record_charge:A").
		Changes(workflow.Renamed("create_order", "make_order"))
	res, err := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}, MaxAttempts: -1}).Resume(w.ctx, renamed)
	require.NoError(t, err)
	require.Equal(t, "make_order", res.ResumedFrom, "in the running definition's names")
	require.Equal(t, 1, w.provider.Effects("charges"))

	gone := workflow.Key{Tenant: "acme", ID: "gone"}
	legacy(gone)
	v3 := w.payFlow("", "open_order:A", "charge:F@charges", "record_charge:A")
	_, err = w.engine(workflow.Config{Workflows: []workflow.Definition{v3}, MaxAttempts: -1}).Resume(w.ctx, gone)
	require.ErrorIs(t, err, workflow.ErrParked)
	rec := w.load(gone)
	require.Equal(t, recovery.StatusParked, rec.Status)
	require.Equal(t, 1, rec.Attempts, "only the crash counts")
}

// TestUpgradeAttackUnreadableUpgradedState: version 2's state upgrader
// cannot read what version 1 committed. Retrying cannot help (it reads the
// same JSON each time), yet each attempt failed and counted, until the key
// stored a 500 after its card was charged. The record parks instead.
func TestUpgradeAttackUnreadableUpgradedState(t *testing.T) {
	w := newWorld(t)
	v1 := w.payFlow("1", "create_order:A", "charge:F@charges", "record_charge:A")
	w.crashIn(v1, func(e *workflow.Engine) error { _, err := v1.Run(w.ctx, e, acme, order); return err },
		workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"}, acme)
	v2 := w.payFlow("2", "create_order:A", "charge:F@charges", "record_charge:A", "receipt:F@receipts").
		UpgradeState(func(json.RawMessage) (Paid, error) { return Paid{}, errBadState })
	_, err := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}, MaxAttempts: -1}).Resume(w.ctx, acme)
	require.ErrorIs(t, err, workflow.ErrParked)
	rec := w.load(acme)
	require.Equal(t, recovery.StatusParked, rec.Status)
	require.Contains(t, rec.LastError, errBadState.Error())
}

var errBadState = errorString("no order_id in the stored state")

type errorString string

func (e errorString) Error() string { return string(e) }

// TestUpgradeAttackReleaseAfterUnregisteredResumeAs: an operator resumed a
// parked record as a version no process registers; the process that took
// it over parked it again, keeping the operator's choice. The operator's
// release ("try the rules again, after deploying Versions") then parked
// it once more, for ever: the spent choice still routed it. A park spends
// the choice, so the release tries the rules, and version 1, registered
// again, finishes the record.
func TestUpgradeAttackReleaseAfterUnregisteredResumeAs(t *testing.T) {
	w := newWorld(t)
	v1 := w.payFlow("1", "create_order:A", "charge:F@charges", "record_charge:A")
	v2 := w.payFlow("2", "create_order:A", "fraud_check:F@checks", "charge:F@charges", "record_charge:A")
	v9 := w.payFlow("9", "create_order:A", "charge:F@charges", "record_charge:A", "note:A")
	require.NoError(t, w.engine(workflow.Config{Workflows: []workflow.Definition{v9}}).SaveDefinitions(w.ctx))
	w.crashIn(v1, func(e *workflow.Engine) error { _, err := v1.Run(w.ctx, e, acme, order); return err },
		workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"}, acme)

	_, err := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}}).Resume(w.ctx, acme)
	require.ErrorIs(t, err, workflow.ErrParked, "charge may have started, and version 2 inserted a step before it")

	both := w.engine(workflow.Config{Workflows: []workflow.Definition{workflow.Versions(v1, v2)}})
	require.NoError(t, both.Store().Unpark(w.ctx, w.load(acme).Fence(), v9.Spec().Fingerprint, "resume as 9"))
	_, err = both.Resume(w.ctx, acme)
	require.ErrorIs(t, err, workflow.ErrParked, "this process does not register version 9")

	require.NoError(t, seam.StoreOf(both.Store()).ReleaseLeaseOver(w.ctx, w.load(acme).Fence(), "try the rules again"))
	res, err := both.Resume(w.ctx, acme)
	require.NoError(t, err, "version 1 wrote the record and is registered")
	require.Equal(t, 200, res.Response.Status)
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.Zero(t, w.provider.Effects("checks"))
}

// TestUpgradeAttackRollingDeployOfARename: version 2 renamed charge to
// charge_card and declared it; version 1 processes still run. A record
// version 2 made stops after its call may have been made, and a version 1
// process takes it over: both derive the call's key from "charge", so it
// resumes (it was parked, the rename read one way only) and charges once.
func TestUpgradeAttackRollingDeployOfARename(t *testing.T) {
	w := newWorld(t)
	v1 := w.payFlow("1", "create_order:A", "charge:F@charges", "record_charge:A")
	v2 := w.payFlow("2", "create_order:A", "charge_card:F@charges", "record_charge:A").
		Changes(workflow.Renamed("charge", "charge_card"))
	w.crashIn(v2, func(e *workflow.Engine) error { _, err := v2.Run(w.ctx, e, acme, order); return err },
		workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge_card"}, acme)

	res, err := w.engine(workflow.Config{Workflows: []workflow.Definition{v1}}).Resume(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, 200, res.Response.Status)
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.Len(t, w.provider.Keys("charges"), 2, "the call was made again, with its key")
	require.Empty(t, workflow.Diff([]workflow.Spec{v2.Spec()}, []workflow.Spec{v1.Spec()}), "the rollback parks nothing")
}

// TestUpgradeAttackResumeAsRenamedPoint: version 2 renamed the recovery
// point's step, declared it, and inserted a step before a charge that may
// have started, so the record parked. The operator vouches for version 2:
// Engine.ResumeAs refused, the point being no step of version 2 by its old
// name, and the record could only be failed. The declared rename applies.
func TestUpgradeAttackResumeAsRenamedPoint(t *testing.T) {
	w := newWorld(t)
	v1 := w.payFlow("1", "create_order:A", "charge:F@charges", "record_charge:A")
	w.crashIn(v1, func(e *workflow.Engine) error { _, err := v1.Run(w.ctx, e, acme, order); return err },
		workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"}, acme)
	v2 := w.payFlow("2", "make_order:A", "fraud_check:F@checks", "charge:F@charges", "record_charge:A").
		Changes(workflow.Renamed("create_order", "make_order"))
	e := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}})
	_, err := e.Resume(w.ctx, acme)
	require.ErrorIs(t, err, workflow.ErrParked)

	res, err := e.ResumeAs(w.ctx, acme, "2")
	require.NoError(t, err)
	require.Equal(t, 200, res.Response.Status)
	require.Equal(t, 1, w.provider.Effects("checks"))
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.Equal(t, 1, w.count(`SELECT count(*) FROM ledger WHERE entry = 'order-1/create_order'`), "make_order did not run again")
}

// TestUpgradeAttackOneLabelTwoDefinitions: two registered definitions
// labelled one version (the steps changed, the label did not) made
// ResumeAs's choice of "1" a coin toss between them. Registering them is
// refused.
func TestUpgradeAttackOneLabelTwoDefinitions(t *testing.T) {
	w := newWorld(t)
	a := w.payFlow("1", "create_order:A", "charge:F@charges", "record_charge:A")
	b := w.payFlow("1", "create_order:A", "charge:F@charges", "record_charge:A", "receipt:F@receipts")
	_, err := workflow.NewEngine(w.db, workflow.Config{Workflows: []workflow.Definition{workflow.Versions(a, b)}})
	require.ErrorIs(t, err, workflow.ErrInvalidInput)

	e := w.engine(workflow.Config{Workflows: []workflow.Definition{workflow.Versions(a, w.payFlow("2", "create_order:A"))}})
	require.ErrorIs(t, e.Register(workflow.Versions(b, w.payFlow("3", "create_order:A", "x:A"))), workflow.ErrInvalidInput)
	require.Equal(t, []string{"1", "2"}, []string{e.Specs()[0].Version, e.Specs()[1].Version}, "a refused registration changes nothing")
	require.Len(t, e.Specs(), 2)
}

// TestUpgradeAttackParkedUnderAZombie: a version 1 attempt stalls in its
// charge past its lease; a version 2 process, which inserted a step before
// the charge, takes the record over and parks it. The client's retry runs
// nothing; the stalled attempt wakes, makes its call and cannot commit; of
// two operators resuming the record at once, one wins. (This held.)
func TestUpgradeAttackParkedUnderAZombie(t *testing.T) {
	w := newWorld(t)
	v1 := w.payFlow("1", "create_order:A", "charge:F@charges", "record_charge:A")
	v2 := w.payFlow("2", "create_order:A", "fraud_check:F@checks", "charge:F@charges", "record_charge:A")
	stalled, wake := make(chan struct{}), make(chan struct{})
	w.before = func(ctx context.Context, step string) error {
		if step == "charge" {
			close(stalled)
			<-wake
		}
		return nil
	}
	zombie := make(chan error, 1)
	e1 := w.engine(workflow.Config{Workflows: []workflow.Definition{v1}})
	go func() { _, err := v1.Run(w.ctx, e1, acme, order); zombie <- err }()
	<-stalled
	w.before = nil // read by the zombie only before it stalled
	require.NoError(t, e1.Store().ExpireLease(w.ctx, acme))

	e2 := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}})
	_, err := v2.Run(w.ctx, e2, acme, order)
	require.ErrorIs(t, err, workflow.ErrParked, "the client's retry")
	_, err = v2.Run(w.ctx, e2, acme, order)
	require.ErrorIs(t, err, workflow.ErrParked, "and again: nothing runs")
	require.Zero(t, w.provider.Effects("checks"))

	close(wake)
	require.ErrorIs(t, <-zombie, workflow.ErrLeaseLost)
	rec := w.load(acme)
	require.Equal(t, recovery.StatusParked, rec.Status)
	require.Zero(t, w.count(`SELECT count(*) FROM ledger WHERE entry LIKE '%/record_charge%'`))

	both := w.engine(workflow.Config{Workflows: []workflow.Definition{workflow.Versions(v1, v2)}})
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- both.Store().Unpark(w.ctx, rec.Fence(), v1.Spec().Fingerprint, "resume as 1") }()
	}
	first, second := <-errs, <-errs
	require.Len(t, slices.DeleteFunc([]error{first, second}, func(err error) bool { return err != nil }), 1, "one operator wins")
	require.ErrorIs(t, errors.Join(first, second), workflow.ErrLeaseLost)
	res, err := both.Resume(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, 200, res.Response.Status)
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.Zero(t, w.provider.Effects("checks"))
}

// TestUpgradeAttackEveryCrashPoint stops the old definition at each of its
// crash points and recovers under the new one, for shapes at the edges of
// the rule: two foreign steps in a row (a step inserted after both, or
// between them), a first step that is foreign, a last step that is
// foreign, and one renamed without a declaration. Each record finishes or
// parks; each foreign effect is made at most once per record, and a record
// that finishes made every one of the definition that finished it, and
// each of its atomic phases once. (This held.)
func TestUpgradeAttackEveryCrashPoint(t *testing.T) {
	w := newWorld(t)
	cases := []struct{ old, cur []string }{
		{[]string{"a0:A", "f1:F@f1", "f2:F@f2", "a3:A"}, []string{"a0:A", "f1:F@f1", "f2:F@f2", "x:F@xx", "a3:A"}},
		{[]string{"a0:A", "f1:F@f1", "f2:F@f2", "a3:A"}, []string{"a0:A", "f1:F@f1", "x:F@xx", "f2:F@f2", "a3:A"}},
		{[]string{"f0:F@f0", "a1:A"}, []string{"x:A", "f0:F@f0", "a1:A"}},
		{[]string{"f0:F@f0", "a1:A"}, []string{"f0:F@f0", "x:F@xx", "a1:A"}},
		{[]string{"a0:A", "f1:F@f1"}, []string{"a0:A", "f1:F@f1", "a2:A"}},
		{[]string{"a0:A", "f1:F@f1"}, []string{"a0:A", "g1:F@f1", "a2:A"}},
	}
	effects := func() map[string]int {
		m := map[string]int{}
		for _, e := range []string{"f0", "f1", "f2", "xx"} {
			m[e] = w.provider.Effects(e)
		}
		return m
	}
	n, parked, finished := 0, 0, 0
	for i, c := range cases {
		old, cur := w.payFlow("old", c.old...), w.payFlow("new", c.cur...)
		for _, point := range workflow.CrashPoints(old) {
			n++
			key := workflow.Key{Tenant: "acme", ID: fmt.Sprintf("k%d", n)}
			name := fmt.Sprintf("case %d, %s", i, point)
			before := effects()
			_, err := old.Run(w.ctx, w.engine(workflow.Config{Hooks: crashAt(point)}), key, order)
			require.ErrorIs(t, err, workflow.ErrCrashed, name)
			rec, err := w.engine(workflow.Config{}).Store().Load(w.ctx, key)
			if errors.Is(err, workflow.ErrNotFound) {
				continue // stopped before its claim
			}
			require.NoError(t, err, name)
			if !rec.Finished() {
				require.NoError(t, w.engine(workflow.Config{}).Store().ExpireLease(w.ctx, key), name)
			}

			res, err := w.engine(workflow.Config{Workflows: []workflow.Definition{cur}}).Resume(w.ctx, key)
			after := effects()
			for e := range after {
				require.LessOrEqual(t, after[e]-before[e], 1, "%s: effect %s repeated", name, e)
			}
			if errors.Is(err, workflow.ErrParked) {
				parked++
				continue
			}
			require.NoError(t, err, name)
			require.Equal(t, 200, res.Response.Status, name)
			finished++
			ran, steps := cur, c.cur
			if res.Replayed {
				ran, steps = old, c.old
			}
			for _, st := range ran.Spec().Steps {
				if st.Kind == phase.KindAtomic {
					require.Equal(t, 1, w.count(`SELECT count(*) FROM ledger WHERE entry = $1`, key.ID+"/"+st.Name), "%s: %s", name, st.Name)
					continue
				}
				e := endpoints(steps)[st.Name]
				require.Equal(t, 1, after[e]-before[e], "%s: effect %s skipped", name, e)
			}
		}
	}
	require.Equal(t, [2]int{12, 24}, [2]int{parked, finished}, "records parked and finished")
}

// endpoints maps the foreign steps of a payFlow to their endpoints.
func endpoints(steps []string) map[string]string {
	m := map[string]string{}
	for _, s := range steps {
		if name, endpoint, ok := strings.Cut(s, ":F@"); ok {
			m[name] = endpoint
		}
	}
	return m
}

// TestUpgradeAttackStateOnlyChangeSkipsUpgrader: version 2 changes only
// the state's shape (charge_id becomes payment_id) and reads version 1's
// states through UpgradeState, without an explicit version. Its steps are
// version 1's; the state's shape is part of the fingerprint, so a record
// version 1 left after the charge is upgraded, not resumed as the same
// definition with the charge's id lost.
func TestUpgradeAttackStateOnlyChangeSkipsUpgrader(t *testing.T) {
	w := newWorld(t)
	v1 := w.payFlow("", "create_order:A", "charge:F@charges", "hold:A", "record_charge:A")
	w.crashIn(v1, func(e *workflow.Engine) error { _, err := v1.Run(w.ctx, e, acme, order); return err },
		workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "hold"}, acme)

	noop := func(context.Context, pgx.Tx, *phase.Run[Order, PaidV2]) error { return nil }
	never := func(context.Context, *foreign.Call[Order, PaidV2]) error { return errBadState }
	v2 := workflow.Define("pay", phase.Atomic("create_order", noop), foreign.Mutation("charge", never),
		phase.Atomic("hold", noop), phase.Atomic("record_charge", noop)).
		UpgradeState(func(old json.RawMessage) (PaidV2, error) {
			var s Paid
			err := json.Unmarshal(old, &s)
			return PaidV2{OrderID: s.OrderID, PaymentID: s.ChargeID}, err
		})
	res, err := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}}).Resume(w.ctx, acme)
	require.NoError(t, err)
	var s PaidV2
	require.NoError(t, json.Unmarshal(res.Response.Body, &s))
	require.NotEmpty(t, s.PaymentID, "the upgrader did not run: the charge's id is lost")
}

// PaidV2 is a state shape a later definition moved to: the charge's id is
// now payment_id.
type PaidV2 struct {
	OrderID   int64  `json:"order_id"`
	PaymentID string `json:"payment_id,omitempty"`
}

// TestUpgradeAttackRollingDeployNewStateShape: version 2 renamed a state
// field and reads version 1's states through UpgradeState; its processes
// register Versions(v1, v2). During the rolling deploy a version 1 process
// is still running. A record version 2 made stops after its charge's id is
// committed, and the version 1 process takes it over: the steps are the
// same, but version 2 declared a change of the state's shape that version 1
// cannot read, so version 1 parks the record rather than complete it
// without the charge's id.
func TestUpgradeAttackRollingDeployNewStateShape(t *testing.T) {
	w := newWorld(t)
	v1 := w.payFlow("1", "create_order:A", "charge:F@charges", "hold:A", "record_charge:A")
	charge := func(ctx context.Context, c *foreign.Call[Order, PaidV2]) error {
		id, err := testapp.Call(ctx, w.provider.URL, "charges", c.Key)
		c.State.PaymentID = id
		return err
	}
	noop := func(context.Context, pgx.Tx, *phase.Run[Order, PaidV2]) error { return nil }
	v2 := workflow.Define("pay", phase.Atomic("create_order", noop), foreign.Mutation("charge", charge),
		phase.Atomic("hold", noop), phase.Atomic("record_charge", noop)).Version("2").
		UpgradeState(func(old json.RawMessage) (PaidV2, error) {
			var s Paid
			err := json.Unmarshal(old, &s)
			return PaidV2{OrderID: s.OrderID, PaymentID: s.ChargeID}, err
		})
	w.crashIn(workflow.Versions(v1, v2), func(e *workflow.Engine) error { _, err := v2.Run(w.ctx, e, acme, order); return err },
		workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "hold"}, acme)

	res, err := w.engine(workflow.Config{Workflows: []workflow.Definition{v1}}).Resume(w.ctx, acme)
	if err == nil {
		var s Paid
		require.NoError(t, json.Unmarshal(res.Response.Body, &s))
		require.NotEmpty(t, s.ChargeID, "version 1 completed version 2's record without its charge")
		return
	}
	require.ErrorIs(t, err, workflow.ErrParked)
}
