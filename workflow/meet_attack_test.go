package workflow_test

// Where compensation, versioning and takeovers meet (the second review):
// each test states a sequence found to break a promise, what the docs
// promise, and what the code did before its fix.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// TestPointOfNoReturnAtAForeignStepIsPassedOnceItsCallMayHaveBeenMade:
// the point of no return is declared after charge, a foreign step whose
// result commits only with the next atomic phase (record). The charge is
// made once and never committed; record never commits. Whether the
// workflow then fails for good in the attempt that charged (record's error
// is permanent, or its attempts run out) or in a takeover that finds the
// attempts spent after a crash right after the charge's call, the charge
// may have been made, so the workflow is past its point of no return:
// nothing is undone, the record ends failed, the charge is kept, as
// PointOfNoReturn("charge") asks. The outcome does not depend on whether
// the process crashed.
//
// Before the fix, the attempt that charged kept the charge (the failing
// step's index was past the point of no return's), while the takeover,
// giving up at the step after the recovery point, refunded it.
func TestPointOfNoReturnAtAForeignStepIsPassedOnceItsCallMayHaveBeenMade(t *testing.T) {
	t.Parallel()
	cases := map[string]func(w *world, s *saga) *workflow.Result{
		"permanent": func(w *world, s *saga) *workflow.Result {
			s.fail["record"] = func(int) error { return phase.Permanent(errors.New("the order table refuses the row")) }
			res, err := s.workflow().Run(w.ctx, w.engine(workflow.Config{}), acme, order)
			require.NoError(w.t, err)
			return res
		},
		"attempts spent in the step": func(w *world, s *saga) *workflow.Result {
			s.fail["record"] = func(int) error { return errors.New("lock timeout") }
			e := w.engine(workflow.Config{MaxAttempts: 2})
			_, err := s.workflow().Run(w.ctx, e, acme, order)
			require.Error(w.t, err)
			res, err := s.workflow().Run(w.ctx, e, acme, order)
			require.NoError(w.t, err)
			return res
		},
		"attempts spent by a crash": func(w *world, s *saga) *workflow.Result {
			s.fail["record"] = func(int) error { return errors.New("lock timeout") }
			e := w.engine(workflow.Config{MaxAttempts: 2})
			_, err := s.workflow().Run(w.ctx, e, acme, order)
			require.Error(w.t, err)
			crash := w.engine(workflow.Config{MaxAttempts: 2, Hooks: crashAt(workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"})})
			_, err = s.workflow().Run(w.ctx, crash, acme, order)
			require.ErrorIs(w.t, err, workflow.ErrCrashed)
			require.NoError(w.t, e.Store().ExpireLease(w.ctx, acme))
			res, err := s.workflow().Run(w.ctx, e, acme, order)
			require.NoError(w.t, err)
			return res
		},
	}
	for name, run := range cases {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t)
			s := newSaga(w)
			s.wf = s.wf.PointOfNoReturn("charge")
			res := run(w, s)
			require.Equal(t, 1, w.provider.Effects("charges"))
			require.Zero(t, w.count(`SELECT count(*) FROM orders`), "record never committed")
			require.Equal(t, "reserve", w.record(acme).RecoveryPoint, "the charge never committed")
			require.True(t, res.Failed)
			require.False(t, res.Compensated)
			require.Equal(t, recovery.StatusFailed, w.record(acme).Status)
			require.Zero(t, w.provider.Effects("refunds"), "past the point of no return: the charge is kept")
			require.Zero(t, w.provider.Effects("releases"))
		})
	}
}

// TestPointOfNoReturnAtAForeignStepThatRefusedIsNotPassed: the foreign
// step the point of no return follows is refused for good (the card is
// declined) in its first call: it made nothing, so the workflow is not
// past its point of no return, and the reservation before it is released.
func TestPointOfNoReturnAtAForeignStepThatRefusedIsNotPassed(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	s.wf = s.wf.PointOfNoReturn("charge")
	s.fail["charge"] = func(int) error { return phase.Permanent(errors.New("card declined")) }
	res, err := s.workflow().Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.NoError(t, err)
	require.True(t, res.Compensated)
	require.Zero(t, w.provider.Effects("refunds"))
	require.Equal(t, 1, w.provider.Effects("releases"))
}

// stateV1 and stateV2 are a state whose field was renamed between two
// definitions (the docs' CheckoutState → CheckoutStateV2).
type (
	stateV1 struct {
		ChargeID string `json:"charge_id"`
	}
	stateV2 struct {
		PaymentID string `json:"payment_id"`
	}
)

// TestAFoldedUpgradeRolledBackBeforeTheUndoKeepsTheState: v1 commits
// charge and record (state {"charge_id": "ch_1"}) and dies. v2 renames the
// state's field and declares UpgradeState, as docs/changing-workflows.md
// shows. The sweeper's Resume (v2) folds its takeover into confirm's
// transaction, upgrades the state and restamps the record there; confirm
// fails for good, so the takeover and the restamp roll back, the key is
// claimed again (the record still stamped v1, its state v1's), and giveUp
// stores the undo list with the state in v2's shape: a record stamped v1
// holding v2's state. The refund fails once. The next attempt took the
// record for v1's again and passed v2's state through UpgradeState: the
// charge's id was gone, and the refund ran with an empty PaymentID. Now the
// claim made again after the rollback is restamped as the rolled-back one
// was: the record is v2's, with v2's state, and every run of the refund
// sees the charge's id.
func TestAFoldedUpgradeRolledBackBeforeTheUndoKeepsTheState(t *testing.T) {
	w := newWorld(t)
	v1 := workflow.Define("upgraded",
		foreign.Mutation("charge", func(_ context.Context, c *foreign.Call[Order, stateV1]) error {
			c.State.ChargeID = "ch_1"
			return nil
		}, foreign.Compensate(func(context.Context, *foreign.Call[Order, stateV1]) error { return nil })),
		phase.Atomic("record", func(context.Context, pgx.Tx, *phase.Run[Order, stateV1]) error { return nil }),
		phase.Atomic("confirm", func(context.Context, pgx.Tx, *phase.Run[Order, stateV1]) error { return nil }),
		foreign.Mutation("ship", func(context.Context, *foreign.Call[Order, stateV1]) error { return nil }),
	)
	crash := w.engine(workflow.Config{Hooks: crashAt(workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "record"})})
	_, err := v1.Run(w.ctx, crash, acme, order)
	require.ErrorIs(t, err, workflow.ErrCrashed)
	require.NoError(t, crash.Store().ExpireLease(w.ctx, acme))
	require.JSONEq(t, `{"charge_id":"ch_1"}`, string(w.record(acme).State))

	var mu sync.Mutex
	var refundsSaw []string
	refundTries := 0
	v2 := workflow.Define("upgraded",
		foreign.Mutation("charge", func(_ context.Context, c *foreign.Call[Order, stateV2]) error {
			c.State.PaymentID = "ch_1"
			return nil
		}, foreign.Compensate(func(_ context.Context, c *foreign.Call[Order, stateV2]) error {
			mu.Lock()
			defer mu.Unlock()
			refundsSaw = append(refundsSaw, c.State.PaymentID)
			refundTries++
			if refundTries == 1 {
				return errors.New("provider: 503")
			}
			return nil
		})),
		phase.Atomic("record", func(context.Context, pgx.Tx, *phase.Run[Order, stateV2]) error { return nil }),
		phase.Atomic("confirm", func(context.Context, pgx.Tx, *phase.Run[Order, stateV2]) error {
			return phase.Permanent(errors.New("the order cannot be confirmed"))
		}),
		foreign.Mutation("ship", func(context.Context, *foreign.Call[Order, stateV2]) error { return nil }),
	).Version("2").UpgradeState(func(old json.RawMessage) (stateV2, error) {
		var s1 stateV1
		err := json.Unmarshal(old, &s1)
		return stateV2{PaymentID: s1.ChargeID}, err
	})

	e := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}})
	_, err = e.Resume(w.ctx, acme)
	require.Error(t, err, "the refund failed once")
	rec := w.record(acme)
	require.True(t, rec.Compensating())
	require.Equal(t, v2.Spec().Fingerprint, rec.Definition, "the record holding v2's state is stamped v2")
	require.JSONEq(t, `{"payment_id":"ch_1"}`, string(rec.State))

	res, err := e.Resume(w.ctx, acme)
	require.NoError(t, err)
	require.True(t, res.Compensated)
	require.Equal(t, []string{"ch_1", "ch_1"}, refundsSaw, "every run of the refund sees the charge's id")
}

// TestAnAbortAfterAnUnseenRestartFailsTheRecord: record writes a ledger
// row, restarts its transaction where the attempt sees it only at its
// commit's check of the mark (COMMIT AND CHAIN on the raw connection), and
// aborts after the charge. The row before the restart is committed. The
// commit that would start compensating is refused at the mark: the record
// fails terminally (a stored 500 every retry gets), as after any restart,
// and the row is there once.
//
// Before the fix, giveUp returned the refused commit's error with the
// lease held: the record stayed in flight, and once the lease ran out the
// retry ran record again and wrote its row twice.
func TestAnAbortAfterAnUnseenRestartFailsTheRecord(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	wf := workflow.Define("restart_abort",
		foreign.Mutation("charge", s.call("charges"), s.undo("refunds")),
		atomicStep("record", func(ctx context.Context, tx pgx.Tx, _ *phase.Run[Order, Paid]) error {
			if _, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, entry) VALUES ($1, 'a')`, 1); err != nil {
				return err
			}
			if _, err := tx.Conn().Exec(ctx, `COMMIT AND CHAIN`); err != nil {
				return err
			}
			return workflow.Abort(workflow.Problem(http.StatusBadGateway, "the charge does not match the order"))
		}),
	)
	e := w.engine(workflow.Config{})
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, res.Failed, describe(res))
	require.Equal(t, recovery.StatusFailed, w.record(acme).Status)
	require.Contains(t, w.record(acme).LastError, "ended or restarted")
	again, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, 1, w.ledger(), "the row the restart committed, once")
}

// TestAnErrorAfterAnUnseenRestartFailsTheRecord: as above, but the phase
// returns an ordinary (transient) error after its unseen restart. Before
// rolling back, the attempt asks whether the phase restarted its
// transaction: it did, so what it wrote before is committed, and the
// record fails terminally rather than be retried.
//
// Before the fix, the attempt rolled back the chained transaction,
// released the key, and the retry ran the phase again: its row twice.
func TestAnErrorAfterAnUnseenRestartFailsTheRecord(t *testing.T) {
	w := newWorld(t)
	wf := workflow.Define("restart_error",
		foreignStep("before", func() error { return nil }),
		atomicStep("write", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			if _, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, entry) VALUES ($1, 'a')`, 1); err != nil {
				return err
			}
			if _, err := tx.Conn().Exec(ctx, `COMMIT AND CHAIN`); err != nil {
				return err
			}
			return errors.New("lock timeout")
		}),
		foreignStep("after", func() error { return nil }),
	)
	e := w.engine(workflow.Config{})
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, res.Failed, describe(res))
	again, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, 1, w.ledger(), "the row the restart committed, once")
}

// TestAttemptsSpentBeforeTheRecordIsReadParkIt: v1 (hold → charge →
// record) dies right after the charge's call; its recovery point is hold.
// v2 renames hold to reserve (declared: Renamed), a change the rules
// resume. The completer's Resume under v2 is the last attempt MaxAttempts
// allows, and it cannot read v1's stored definition to compare (here the
// table is gone for a moment). The attempt may not give up by undoing
// what it guesses the record did: it parks the record, nothing undone, and
// an operator's resume as v2 then finishes it, the rename followed.
//
// Before the fix, the attempt gave up unplaced: v1's recovery point
// "hold" looked up among v2's steps found nothing, nothing was undone, and
// a 500 was stored with the charge and the hold kept.
func TestAttemptsSpentBeforeTheRecordIsReadParkIt(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	v1 := workflow.Define("renamed_saga",
		foreign.Mutation("hold", s.call("reservations"), s.undo("releases")),
		foreign.Mutation("charge", s.call("charges"), s.undo("refunds")),
		atomicStep("record", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil }),
	)
	crash := w.engine(workflow.Config{Hooks: crashAt(workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"})})
	_, err := v1.Run(w.ctx, crash, acme, order)
	require.ErrorIs(t, err, workflow.ErrCrashed)
	require.NoError(t, crash.Store().ExpireLease(w.ctx, acme))
	require.Equal(t, "hold", w.record(acme).RecoveryPoint)

	v2 := workflow.Define("renamed_saga",
		foreign.Mutation("reserve", s.call("reservations"), s.undo("releases")),
		foreign.Mutation("charge", s.call("charges"), s.undo("refunds")),
		atomicStep("record", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil }),
	).Version("2").Changes(workflow.Renamed("hold", "reserve"))
	_, why := workflow.Resumable(v1.Spec(), "hold", v2.Spec())
	require.Empty(t, why, "the rename is a change the rules resume")

	e := w.engine(workflow.Config{MaxAttempts: 2, Workflows: []workflow.Definition{v2}})
	require.NoError(t, e.SaveDefinitions(w.ctx))
	_, err = w.db.Exec(w.ctx, `ALTER TABLE onceflow_definitions RENAME TO onceflow_definitions_away`)
	require.NoError(t, err)
	_, err = e.Resume(w.ctx, acme)
	_, back := w.db.Exec(w.ctx, `ALTER TABLE onceflow_definitions_away RENAME TO onceflow_definitions`)
	require.NoError(t, back)
	require.ErrorIs(t, err, workflow.ErrParked)
	require.Equal(t, recovery.StatusParked, w.record(acme).Status)
	require.Zero(t, w.provider.Effects("refunds"))
	require.Zero(t, w.provider.Effects("releases"))

	res, err := e.ResumeAs(w.ctx, acme, "2")
	require.NoError(t, err)
	require.Equal(t, 200, res.Response.Status, describe(res))
	require.Equal(t, recovery.StatusCompleted, w.record(acme).Status)
	require.Equal(t, 1, w.provider.Effects("charges"), "the charge made again under its key, the rename followed")
	require.Equal(t, 1, w.provider.Effects("reservations"))
}

// TestAStaleFailureUnderAnOlderDefinitionHandsTheKeyBack: a rolling deploy.
// v1 is open → record → ship; v2 inserts charge (foreign, refunded) after
// open, which the rules let v2 resume at open (and let v1 not: a record v2
// restamped at open parks under v1, charge may have started). The record
// is at open, record having failed once. A v1 process resumes it, folded
// into record's transaction; record fails again. Between its rollback and
// its reclaim, a v2 process takes the record over, restamps it, charges,
// and fails at record (released, recovery point still open). The v1
// attempt's reclaim sees the same recovery point and takes its stale
// failure for the record's: this being the last attempt MaxAttempts
// allows, it gave up under v1's definition, which knows no charge: the
// record ended failed with the charge kept, never refunded, where v2 (or
// a park) would have refunded it. Now the claim made again after the
// rollback sees that another attempt ended meanwhile (an attempt counted,
// the definition restamped), and hands the key back: the record stays
// v2's, in flight.
// (TestAFailureOvertakenWhileItsClaimWasRolledBackDoesNotGiveUp covers an
// overtaking attempt that moved the recovery point; this one moved the
// definition.)
func TestAStaleFailureUnderAnOlderDefinitionHandsTheKeyBack(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	open := func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil }
	record := func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return errors.New("lock timeout") }
	v1 := workflow.Define("rolling",
		atomicStep("open", open),
		atomicStep("record", record),
		foreign.Mutation("ship", s.call("shipments")),
	).Version("1")
	v2 := workflow.Define("rolling",
		atomicStep("open", open),
		foreign.Mutation("charge", s.call("charges"), s.undo("refunds")),
		atomicStep("record", record),
		foreign.Mutation("ship", s.call("shipments")),
	).Version("2")
	_, why := workflow.Resumable(v1.Spec(), "open", v2.Spec())
	require.Empty(t, why)
	_, why = workflow.Resumable(v2.Spec(), "open", v1.Spec())
	require.NotEmpty(t, why, "v1 may not resume a record v2 wrote at open")
	t.Logf("v1 meeting v2's record at open: %s", why)

	_, err := v1.Run(w.ctx, w.engine(workflow.Config{MaxAttempts: 3}), acme, order)
	require.Error(t, err)
	require.Equal(t, "open", w.record(acme).RecoveryPoint)
	require.Equal(t, 1, w.record(acme).Attempts)

	newer := w.engine(workflow.Config{MaxAttempts: 3, Workflows: []workflow.Definition{v2}})
	require.NoError(t, newer.SaveDefinitions(w.ctx))
	var overtook error
	older := w.engine(workflow.Config{MaxAttempts: 3, Workflows: []workflow.Definition{v1},
		Logger: slog.New(&onMessage{msg: "workflow step failed", fn: func() {
			_, overtook = newer.Resume(w.ctx, acme)
		}})})
	_, err = older.Resume(w.ctx, acme)
	require.Error(t, err)
	require.Error(t, overtook, "v2's attempt failed at record and released the key")
	require.Equal(t, 1, w.provider.Effects("charges"), "v2 charged")
	rec := w.record(acme)
	require.Equal(t, recovery.StatusInFlight, rec.Status, "the stale failure hands the key back")
	require.Equal(t, v2.Spec().Fingerprint, rec.Definition)
	require.Equal(t, "open", rec.RecoveryPoint)
	require.Empty(t, rec.Undo)
	require.Zero(t, w.provider.Effects("refunds"))
}

// TestARejectAfterAnUnseenRestartFailsTheRecord: a first phase writes a
// ledger row, restarts its transaction unseen (COMMIT AND CHAIN on the raw
// connection), and rejects the request. The restart committed the row, so
// the key may not be left free for a fresh execution: the record fails
// terminally, and the client's second request gets the stored 500.
//
// Before the fix, the Reject rolled back only the chained transaction and
// left the key free; the second request ran the phase again: two rows.
func TestARejectAfterAnUnseenRestartFailsTheRecord(t *testing.T) {
	w := newWorld(t)
	wf := workflow.Define("restart_reject",
		atomicStep("validate", func(ctx context.Context, tx pgx.Tx, _ *phase.Run[Order, Paid]) error {
			if _, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, entry) VALUES ($1, 'a')`, 1); err != nil {
				return err
			}
			if _, err := tx.Conn().Exec(ctx, `COMMIT AND CHAIN`); err != nil {
				return err
			}
			return workflow.Reject(workflow.Problem(http.StatusUnprocessableEntity, "the address is incomplete"))
		}),
		foreignStep("charge", func() error { return nil }),
	)
	e := w.engine(workflow.Config{})
	for i := range 2 {
		res, err := wf.Run(w.ctx, e, acme, order)
		require.NoError(t, err)
		require.False(t, res.Rejected)
		require.Equal(t, 500, res.Response.Status)
		require.Equal(t, i == 1, res.Replayed)
	}
	require.Equal(t, 1, w.ledger(), "the row the restart committed, once")
}

// onRollback is a pgx.QueryTracer that runs fn, once, right after the
// first "rollback" statement sent once armed: a hook between an attempt's
// rollback and what it does next.
type onRollback struct {
	armed atomic.Bool
	once  sync.Once
	fn    func()
}

type sqlKey struct{}

func (h *onRollback) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, sqlKey{}, data.SQL)
}

func (h *onRollback) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if sql, _ := ctx.Value(sqlKey{}).(string); sql == "rollback" && h.armed.Load() {
		h.once.Do(h.fn)
	}
}

// TestAStaleRejectLeavesARecordAnotherDefinitionCharged: a rolling
// deploy. v1 is validate (atomic) → charge → record; v2 dropped validate:
// charge → record. The rules let v2 resume v1's records with nothing
// committed (v1 can have done nothing outside the database before
// validate commits). The record is unstarted (validate failed once). A v1
// process's retry takes it over in validate's transaction, and validate
// rejects the request. Between the rollback and the reclaim that
// DeleteUnstarted needs, a v2 process takes the record over, restamps it,
// charges under the record's id, and fails at record (released; still no
// recovery point). The v1 attempt reclaims (its recovery point unchanged:
// none) and deleted the record: the key was free again, and the charge made
// under the deleted record's id forgotten. The client's next request made
// a new record, with a new id, and was charged again under a new key. Now
// the claim made again sees that another attempt ended meanwhile (an
// attempt counted, the definition restamped): the Reject keeps the record
// and answers as a lost lease, and the client's next request resumes the
// record, charging under the same key.
func TestAStaleRejectLeavesARecordAnotherDefinitionCharged(t *testing.T) {
	w := newWorld(t)
	s := newSaga(w)
	var reject atomic.Bool
	record := func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return errors.New("lock timeout") }
	v1 := workflow.Define("dropped",
		atomicStep("validate", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error {
			if reject.Load() {
				return workflow.Reject(workflow.Problem(http.StatusUnprocessableEntity, "the address is incomplete"))
			}
			return errors.New("lock timeout")
		}),
		foreign.Mutation("charge", s.call("charges")),
		atomicStep("record", record),
	).Version("1")
	v2 := workflow.Define("dropped",
		foreign.Mutation("charge", s.call("charges")),
		atomicStep("record", record),
	).Version("2").Changes(workflow.Removed("validate"))
	_, why := workflow.Resumable(v1.Spec(), "", v2.Spec())
	require.Empty(t, why)

	_, err := v1.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.Error(t, err)
	require.Empty(t, w.record(acme).RecoveryPoint)

	newer := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}})
	require.NoError(t, newer.SaveDefinitions(w.ctx))
	var overtook error
	hook := &onRollback{fn: func() { _, overtook = newer.Resume(w.ctx, acme) }}
	cfg := w.db.Config().Copy()
	cfg.ConnConfig.Tracer = hook
	pool, err := pgxpool.NewWithConfig(w.ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	older, err := workflow.NewEngine(pool, workflow.Config{Workflows: []workflow.Definition{v1}})
	require.NoError(t, err)
	require.NoError(t, older.SaveDefinitions(w.ctx))

	reject.Store(true)
	hook.armed.Store(true)
	_, err = v1.Run(w.ctx, older, acme, order)
	require.ErrorIs(t, err, workflow.ErrLeaseLost)
	require.Error(t, overtook, "v2's attempt failed at record and released the key")
	require.Equal(t, 1, w.provider.Effects("charges"), "v2 charged")
	require.Equal(t, 1, w.keys(), "the record v2 charged under is kept")

	// The client sends the order again, to the new release.
	reject.Store(false)
	_, err = v2.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.Error(t, err, "record still fails")
	require.Equal(t, 1, w.provider.Effects("charges"), "charged once for one key (provider keys %v)", w.provider.Keys("charges"))
}

// describe is a result as a test log reads it.
func describe(res *workflow.Result) string {
	if res == nil {
		return "no result"
	}
	return fmt.Sprintf("status %d %s (failed %v, compensated %v, rejected %v)",
		res.Response.Status, res.Response.Body, res.Failed, res.Compensated, res.Rejected)
}

// TestDiffListsWhatAChangedUndoKeyParks: a release drops the charge's
// rename declaration (Renamed("pay", "charge")). Records past the charge
// park under it (TestAnUpgradeThatChangesACompletedStepsKeysDoesNotUndoAnotherCall:
// their refund would name a charge never made); workflow.Diff, which
// `onceflow workflows diff` runs, lists those recovery points too. Before
// the fix it compared with Resumable alone and listed none of them.
func TestDiffListsWhatAChangedUndoKeyParks(t *testing.T) {
	t.Parallel()
	s := &saga{fail: map[string]func(int) error{}}
	prev, cur := s.renamed(true).Spec(), s.renamed(false).Spec()
	points := map[string]bool{}
	for _, f := range workflow.Diff([]workflow.Spec{prev}, []workflow.Spec{cur}) {
		points[f.RecoveryPoint] = true
	}
	require.True(t, points["charge"], "records at charge park when resumed: %v", points)
}

// TestDiffCountsAForeignPointOfNoReturnOnceItsCallMayHaveBeenMade: v1's
// point of no return follows charge, a foreign step; v2 moves it to
// record_charge. A record at create_order may have made the charge: v1
// keeps it, v2 would refund it. The deploy check lists that recovery point.
func TestDiffCountsAForeignPointOfNoReturnOnceItsCallMayHaveBeenMade(t *testing.T) {
	v1 := specNoReturn(t, "v1", []string{"create_order:A", "charge:FC", "record_charge:A", "ship:F"}, "charge")
	v2 := specNoReturn(t, "v2", []string{"create_order:A", "charge:FC", "record_charge:A", "ship:F"}, "record_charge")
	findings := workflow.Diff([]workflow.Spec{v1}, []workflow.Spec{v2})
	require.NotEmpty(t, findings)
	require.Equal(t, "create_order", findings[0].RecoveryPoint, "%v", findings)
	require.Contains(t, findings[0].Reason, "point of no return")
}
