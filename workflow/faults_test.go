package workflow_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// Trail is the state of the ledger workflow: the steps whose results were
// committed, in order.
type Trail struct {
	OrderID int64    `json:"order_id"`
	Steps   []string `json:"steps"`
}

// ledgerSteps are the ledger workflow's steps in order; the foreign ones
// are charge and send_receipt.
var ledgerSteps = []string{"create_order", "charge", "send_receipt", "record_charge", "close"}

// effects counts what the ledger workflow did: one row per atomic phase run
// (in the effects table) and one call per foreign step run, by its derived
// key.
type effects struct {
	w     *world
	mu    sync.Mutex
	calls map[string]int      // derived key -> calls
	keys  map[string][]string // client key -> the derived keys it called with
}

func newEffects(w *world) *effects {
	_, err := w.db.Exec(w.ctx, `CREATE TABLE effects (tenant text NOT NULL, key text NOT NULL, step text NOT NULL)`)
	require.NoError(w.t, err)
	return &effects{w: w, calls: map[string]int{}, keys: map[string][]string{}}
}

func (f *effects) call(c *foreign.Call[Order, Trail]) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls[c.Key] == 0 {
		f.keys[c.Run.Key.ID] = append(f.keys[c.Run.Key.ID], c.Key)
	}
	f.calls[c.Key]++
	c.State.Steps = append(c.State.Steps, c.Step)
}

// snapshot is every count of key's effects: rows per atomic phase, and
// calls per derived key.
func (f *effects) snapshot(key workflow.Key) map[string]int {
	f.w.t.Helper()
	counts := map[string]int{}
	rows, err := f.w.db.Query(f.w.ctx, `SELECT step, count(*) FROM effects WHERE tenant = $1 AND key = $2 GROUP BY step`,
		key.Tenant, key.ID)
	require.NoError(f.w.t, err)
	for rows.Next() {
		var (
			step string
			n    int
		)
		require.NoError(f.w.t, rows.Scan(&step, &n))
		counts["rows of "+step] = n
	}
	require.NoError(f.w.t, rows.Err())
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, dk := range f.keys[key.ID] {
		counts["calls with "+dk] = f.calls[dk]
	}
	return counts
}

// requireOnce checks that each of key's steps took effect exactly once: one
// row per atomic phase, one call per foreign step, with the key derived
// from the record.
func (f *effects) requireOnce(e *workflow.Engine, key workflow.Key) {
	f.w.t.Helper()
	rec, err := e.Store().Load(f.w.ctx, key)
	require.NoError(f.w.t, err)
	want := map[string]int{
		"rows of create_order":  1,
		"rows of record_charge": 1,
		"rows of close":         1,
		"calls with " + foreign.DeriveKey(key, rec.ID, "charge"):       1,
		"calls with " + foreign.DeriveKey(key, rec.ID, "send_receipt"): 1,
	}
	require.Equal(f.w.t, want, f.snapshot(key), "every step of %s took effect exactly once", key.ID)
}

// ledger declares create_order (atomic) → charge (foreign) → send_receipt
// (foreign) → record_charge (atomic) → close (atomic). Its commits are
// create_order's, charge's on its own (a foreign step follows it),
// record_charge's with send_receipt's result, and close's with the
// response. The response holds no identifier from a sequence or a record,
// so every run of one request answers the same bytes.
func (f *effects) ledger() *workflow.Workflow[Order, Trail] {
	atomic := func(name string) phase.Step[Order, Trail] {
		return phase.Atomic(name, func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Trail]) error {
			r.State.Steps = append(r.State.Steps, r.Step)
			_, err := tx.Exec(ctx, `INSERT INTO effects (tenant, key, step) VALUES ($1, $2, $3)`, r.Key.Tenant, r.Key.ID, r.Step)
			return err
		})
	}
	call := func(name string) phase.Step[Order, Trail] {
		return foreign.Mutation(name, func(_ context.Context, c *foreign.Call[Order, Trail]) error {
			f.call(c)
			return nil
		})
	}
	return workflow.Define("ledger",
		atomic("create_order"), call("charge"), call("send_receipt"), atomic("record_charge"), atomic("close"),
	).Finish(func(s *Trail) workflow.Response {
		return workflow.JSON(201, map[string]any{"steps": s.Steps})
	})
}

// afterCommits lists the workflow's AfterCommit crash points in order.
func afterCommits(d workflow.Definition) []workflow.CrashPoint {
	var points []workflow.CrashPoint
	for _, p := range workflow.CrashPoints(d) {
		if p.Kind == workflow.AfterCommit {
			points = append(points, p)
		}
	}
	return points
}

// TestAmbiguousCommit: a commit succeeds but its acknowledgement is lost
// (the attempt stops right after it, and the caller gets an error). At each
// commit point (the first phase, a foreign step's own commit, a middle
// phase, and the completion) the retry resumes after what was committed, or
// replays when the completion was committed, and nothing runs twice: each
// phase wrote one row, each foreign call went out once with its derived
// key, and the final response is the bytes an uninterrupted run answers.
func TestAmbiguousCommit(t *testing.T) {
	w := newWorld(t)
	fx := newEffects(w)
	wf := fx.ledger()
	points := afterCommits(wf)
	require.Equal(t, []workflow.CrashPoint{
		{Kind: workflow.AfterCommit, Step: "create_order"},
		{Kind: workflow.AfterCommit, Step: "charge"},
		{Kind: workflow.AfterCommit, Step: "record_charge"},
		{Kind: workflow.AfterCommit, Step: "close"},
	}, points, "the commit points this test covers")

	e := w.engine(workflow.Config{})
	uninterrupted := workflow.Key{Tenant: "acme", ID: "uninterrupted"}
	want, err := e.Run(w.ctx, uninterrupted, wf, order)
	require.NoError(t, err)
	require.Equal(t, 201, want.Response.Status)
	require.JSONEq(t, `{"steps":["create_order","charge","send_receipt","record_charge","close"]}`, string(want.Response.Body))
	fx.requireOnce(e, uninterrupted)

	for _, point := range points {
		t.Run(point.String(), func(t *testing.T) {
			key := workflow.Key{Tenant: "acme", ID: "lost-ack-" + point.Step}
			completion := point.Step == ledgerSteps[len(ledgerSteps)-1]
			_, err := w.engine(workflow.Config{Hooks: crashAt(point)}).Run(w.ctx, key, wf, order)
			require.ErrorIs(t, err, workflow.ErrCrashed, "the caller sees an error")

			rec, err := e.Store().Load(w.ctx, key)
			require.NoError(t, err)
			if completion {
				require.Equal(t, recovery.StatusCompleted, rec.Status, "the completion committed")
			} else {
				require.Equal(t, recovery.StatusInFlight, rec.Status)
				require.Equal(t, point.Step, rec.RecoveryPoint, "the commit landed")
				require.False(t, rec.Released, "a lost acknowledgement releases nothing")
				_, err = e.Run(w.ctx, key, wf, order)
				require.ErrorIs(t, err, workflow.ErrInFlight, "the silent attempt's lease holds until it expires")
				require.NoError(t, e.Store().ExpireLease(w.ctx, key))
			}
			before := fx.snapshot(key)

			res, err := e.Run(w.ctx, key, wf, order)
			require.NoError(t, err)
			require.Equal(t, want.Response, res.Response, "the retry answers what an uninterrupted run does")
			if completion {
				require.True(t, res.Replayed)
				require.Equal(t, recovery.OutcomeReplay, res.Outcome)
				require.Equal(t, before, fx.snapshot(key), "a replay executes nothing")
			} else {
				require.False(t, res.Replayed)
				require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
				require.Equal(t, point.Step, res.ResumedFrom, "the retry resumes after the committed step")
			}
			fx.requireOnce(e, key)

			again, err := e.Run(w.ctx, key, wf, order)
			require.NoError(t, err)
			require.True(t, again.Replayed)
			require.Equal(t, want.Response, again.Response)
			fx.requireOnce(e, key)
		})
	}
}

// TestEveryAcknowledgementLost: each attempt loses the acknowledgement of
// its first commit, so every commit of the workflow is made by a different
// attempt whose caller saw an error; the steps still take effect once each,
// and the retry after the completion replays its response.
func TestEveryAcknowledgementLost(t *testing.T) {
	w := newWorld(t)
	fx := newEffects(w)
	wf := fx.ledger()
	e := w.engine(workflow.Config{MaxAttempts: -1})
	crashing := w.engine(workflow.Config{MaxAttempts: -1, Hooks: &workflow.Hooks{
		CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
			if p.Kind == workflow.AfterCommit {
				return errors.New("the acknowledgement was lost")
			}
			return nil
		}}})
	var committed []string
	for range ledgerSteps {
		_, err := crashing.Run(w.ctx, acme, wf, order)
		require.ErrorIs(t, err, workflow.ErrCrashed)
		rec, err := e.Store().Load(w.ctx, acme)
		require.NoError(t, err)
		committed = append(committed, rec.RecoveryPoint)
		if rec.Finished() {
			break
		}
		require.NoError(t, e.Store().ExpireLease(w.ctx, acme))
	}
	require.Equal(t, []string{"create_order", "charge", "record_charge", "close"}, committed,
		"each attempt committed one step further")
	before := fx.snapshot(acme)
	res, err := e.Run(w.ctx, acme, wf, order)
	require.NoError(t, err)
	require.True(t, res.Replayed, "the completion was committed: the retry replays")
	require.JSONEq(t, `{"steps":["create_order","charge","send_receipt","record_charge","close"]}`, string(res.Response.Body))
	require.Equal(t, before, fx.snapshot(acme), "a replay executes nothing")
	fx.requireOnce(e, acme)
}
