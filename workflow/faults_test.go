package workflow_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/pgproxy"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// The statements by which the engine commits, as the proxy recognises
// them (recovery/sql.go and recovery/pipeline.go word them). Each is a
// stable fragment of one statement, not a round trip: a phase's batch is
// its fenced write, then "commit".
var (
	// commitStatement ends a phase's batch (AdvanceAndCommit,
	// CompleteAndCommit), and a takeover committed on its own. Matched
	// whole: "begin isolation level read committed" is no commit.
	commitStatement = pgproxy.Statement("commit")
	// claimStatement claims a key: onceflow_claim, which commits on its own
	// when the first step is foreign, or onceflow_claim_deferred, opening
	// the first phase's transaction.
	claimStatement = pgproxy.Containing("onceflow_claim")
	// insertStatement inserts a record its claim left unwritten: the first
	// phase's fenced write (migration 0019).
	insertStatement = pgproxy.Containing("onceflow_keys (tenant_id, key, id,")
	// advanceStatement records a recovery point: Advance on its own (a
	// foreign step followed by a foreign step), or a phase's fenced write.
	advanceStatement = pgproxy.Containing("SET recovery_point")
	// finishStatement completes a key: CompleteAfter on its own (the last
	// step is foreign), or the last phase's fenced write.
	finishStatement = pgproxy.Containing("SET status")
	// releaseStatement hands the lease back after a failed step.
	releaseStatement = pgproxy.Containing("attempts = attempts + 1")
)

// stepCommit matches the fenced write that commits a step's result, on
// its own or in a phase's batch, and not a takeover's own commit.
func stepCommit(sql string) bool {
	return insertStatement(sql) || advanceStatement(sql) || finishStatement(sql)
}

// Trail is the state of the workflows here: the steps whose results were
// committed, in order.
type Trail struct {
	OrderID int64    `json:"order_id"`
	Steps   []string `json:"steps"`
}

// effects counts what the workflows here did: one row per atomic phase run
// (in the effects table), and the calls a fake provider got from foreign
// steps, by derived key. Like a real one, the provider deduplicates: the
// first call with a key takes effect, later ones answer the same.
type effects struct {
	w     *world
	mu    sync.Mutex
	calls map[string]int      // derived key -> calls
	keys  map[string][]string // client key -> the derived keys it called with
	fail  string              // a foreign step whose next run fails before calling
}

func newEffects(w *world) *effects {
	_, err := w.db.Exec(w.ctx, `CREATE TABLE effects (tenant text NOT NULL, key text NOT NULL, step text NOT NULL)`)
	require.NoError(w.t, err)
	return &effects{w: w, calls: map[string]int{}, keys: map[string][]string{}}
}

// failNext makes the next run of step fail, before it calls the provider.
func (f *effects) failNext(step string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = step
}

func (f *effects) call(c *foreign.Call[Order, Trail]) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail == c.Step {
		f.fail = ""
		return errors.New("the provider is unavailable")
	}
	if f.calls[c.Key] == 0 {
		f.keys[c.Run.Key.ID] = append(f.keys[c.Run.Key.ID], c.Key)
	}
	f.calls[c.Key]++
	c.State.Steps = append(c.State.Steps, c.Step)
	return nil
}

// snapshot is every count of key's effects: rows per atomic phase, read
// straight from the database, and calls per derived key.
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

// requireOnce checks that each of wf's steps took effect exactly once for
// key: one row per atomic phase, one effect per foreign step, under the key
// derived from the record and no other. The foreign steps in repeated were
// called twice with that key (the provider took the second for the first);
// every other step ran once.
func (f *effects) requireOnce(e *workflow.Engine, key workflow.Key, wf workflow.Definition, repeated ...string) {
	f.w.t.Helper()
	rec, err := e.Store().Load(f.w.ctx, key)
	require.NoError(f.w.t, err)
	want := map[string]int{}
	for _, s := range wf.Steps() {
		if s.Kind == phase.KindAtomic {
			want["rows of "+s.Name] = 1
		} else {
			want["calls with "+foreign.DeriveKey(key, rec.ID, s.Name)] = 1
		}
	}
	for _, s := range repeated {
		want["calls with "+foreign.DeriveKey(key, rec.ID, s)] = 2
	}
	require.Equal(f.w.t, want, f.snapshot(key), "every step of %s took effect exactly once", key.ID)
}

func (f *effects) atomic(name string) phase.Step[Order, Trail] {
	return phase.Atomic(name, func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Trail]) error {
		r.State.Steps = append(r.State.Steps, r.Step)
		_, err := tx.Exec(ctx, `INSERT INTO effects (tenant, key, step) VALUES ($1, $2, $3)`, r.Key.Tenant, r.Key.ID, r.Step)
		return err
	})
}

func (f *effects) foreign(name string) phase.Step[Order, Trail] {
	return foreign.Mutation(name, func(_ context.Context, c *foreign.Call[Order, Trail]) error { return f.call(c) })
}

// define declares a workflow of steps whose response holds no identifier
// from a sequence or a record, so every run of one request answers the
// same bytes.
func (f *effects) define(name string, steps ...phase.Step[Order, Trail]) *workflow.Workflow[Order, Trail] {
	return workflow.Define(name, steps...).Finish(func(s *Trail) workflow.Response {
		return workflow.JSON(201, map[string]any{"steps": s.Steps})
	})
}

// ledger declares create_order (atomic) → charge (foreign) → send_receipt
// (foreign) → record_charge (atomic) → close (atomic). Its commits are
// create_order's with the claim, charge's on its own (a foreign step
// follows it), record_charge's with send_receipt's result, and close's
// with the response.
func (f *effects) ledger() *workflow.Workflow[Order, Trail] {
	return f.define("ledger", f.atomic("create_order"), f.foreign("charge"), f.foreign("send_receipt"),
		f.atomic("record_charge"), f.atomic("close"))
}

// relay declares charge (foreign) → record_charge (atomic) → send_receipt
// (foreign). Its commits are the claim on its own, record_charge's with
// charge's result, and send_receipt's completion on its own.
func (f *effects) relay() *workflow.Workflow[Order, Trail] {
	return f.define("relay", f.foreign("charge"), f.atomic("record_charge"), f.foreign("send_receipt"))
}

// proxied returns a pool whose connections go through a proxy between the
// engine and the test's database, and the proxy. The assertions go
// straight to the database (w.db), where no rule reaches them.
func (w *world) proxied() (*pgproxy.Proxy, *pgxpool.Pool) {
	w.t.Helper()
	proxy, url := pgproxy.Start(w.t, w.db.Config().ConnConfig.ConnString())
	return proxy, dbtest.Connect(w.t, url, 8)
}

func newEngine(t *testing.T, db workflow.DB, cfg workflow.Config) *workflow.Engine {
	t.Helper()
	e, err := workflow.NewEngine(db, cfg)
	require.NoError(t, err)
	return e
}

// aftermath is what a lost request or acknowledgement leaves, and what the
// retry does about it.
type aftermath struct {
	absent    bool     // the claim rolled back: no record, the retry starts anew
	completed bool     // the completion committed: the retry replays
	point     string   // else the record's recovery point, where the retry resumes
	held      bool     // the faulted attempt kept its lease: the retry waits for it to expire
	repeated  []string // foreign steps the retry calls again, with the same key
}

// commitPoint is a commit of the engine, the statement that makes it, and
// what losing its acknowledgement or its request leaves.
type commitPoint struct {
	name string
	wf   *workflow.Workflow[Order, Trail]
	// at is the crash point the attempt passes just before it sends the
	// statement; the rule is armed there. The zero point arms it before
	// the run.
	at        workflow.CrashPoint
	statement func(string) bool
	fail      string // a step that fails once in the faulted run
	lostAck   aftermath
	lostReq   aftermath
}

// TestAmbiguousCommit: at each commit point of the engine, the proxy
// between the engine and PostgreSQL loses the commit's acknowledgement (the
// server commits, the connection drops before the client hears of it) or
// its request (the connection drops before the server gets it). The
// caller sees the same error either way. The retry resumes after what was
// committed, or replays when the completion was, and nothing runs twice:
// each phase wrote one row, each foreign step took effect once with its
// derived key (called again, with that key, only when its result's commit
// was lost), and the response is the bytes an uninterrupted run answers.
func TestAmbiguousCommit(t *testing.T) {
	w := newWorld(t)
	fx := newEffects(w)
	proxy, pool := w.proxied()
	direct := w.engine(workflow.Config{}) // reads and expires leases, unfaulted
	retrying := newEngine(t, pool, workflow.Config{})
	ledger, relay := fx.ledger(), fx.relay()
	before := func(step string) workflow.CrashPoint {
		return workflow.CrashPoint{Kind: workflow.BeforeStep, Step: step}
	}
	beforeCommit := func(step string) workflow.CrashPoint {
		return workflow.CrashPoint{Kind: workflow.BeforeCommit, Step: step}
	}
	afterCall := func(step string) workflow.CrashPoint {
		return workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: step}
	}
	points := []commitPoint{
		{name: "create_order's commit with the claim", wf: ledger, at: beforeCommit("create_order"), statement: commitStatement,
			lostAck: aftermath{point: "create_order"},
			lostReq: aftermath{absent: true}},
		{name: "charge's advance on its own", wf: ledger, at: afterCall("charge"), statement: advanceStatement,
			lostAck: aftermath{point: "charge"},
			lostReq: aftermath{point: "create_order", repeated: []string{"charge"}}},
		{name: "record_charge's commit", wf: ledger, at: beforeCommit("record_charge"), statement: commitStatement,
			lostAck: aftermath{point: "record_charge"},
			lostReq: aftermath{point: "charge", repeated: []string{"send_receipt"}}},
		{name: "close's commit with the completion", wf: ledger, at: beforeCommit("close"), statement: commitStatement,
			lostAck: aftermath{completed: true},
			lostReq: aftermath{point: "record_charge"}},
		{name: "the release after a failed step", wf: ledger, at: before("send_receipt"), statement: releaseStatement,
			fail:    "send_receipt",
			lostAck: aftermath{point: "charge"},
			lostReq: aftermath{point: "charge", held: true}},
		{name: "the claim on its own", wf: relay, statement: claimStatement,
			lostAck: aftermath{held: true},
			lostReq: aftermath{absent: true}},
		{name: "a phase's commit without the claim", wf: relay, at: beforeCommit("record_charge"), statement: commitStatement,
			lostAck: aftermath{point: "record_charge"},
			lostReq: aftermath{repeated: []string{"charge"}}},
		{name: "send_receipt's completion on its own", wf: relay, at: afterCall("send_receipt"), statement: finishStatement,
			lostAck: aftermath{completed: true},
			lostReq: aftermath{point: "record_charge", repeated: []string{"send_receipt"}}},
	}

	want := map[string]workflow.Response{}
	for _, wf := range []*workflow.Workflow[Order, Trail]{ledger, relay} {
		key := workflow.Key{Tenant: "acme", ID: wf.Name() + " uninterrupted"}
		res, err := wf.Run(w.ctx, retrying, key, order)
		require.NoError(t, err)
		require.Equal(t, 201, res.Response.Status)
		fx.requireOnce(direct, key, wf)
		want[wf.Name()] = res.Response
	}

	for _, c := range points {
		for _, fault := range []pgproxy.Fault{pgproxy.LoseAcknowledgement, pgproxy.LoseRequest} {
			after := c.lostAck
			if fault == pgproxy.LoseRequest {
				after = c.lostReq
			}
			t.Run(c.name+"/"+fault.String(), func(t *testing.T) {
				key := workflow.Key{Tenant: "acme", ID: c.name + ", " + fault.String()}
				fx.failNext(c.fail)
				armed := loseAt(t, proxy, pool, key, c, fault)
				require.Equal(t, 1, armed.Fired(), "the %s happened", fault)
				requireLeft(t, direct, key, after)
				if after.held {
					_, err := c.wf.Run(w.ctx, retrying, key, order)
					require.ErrorIs(t, err, workflow.ErrInFlight, "the faulted attempt's lease holds until it expires")
					require.NoError(t, direct.Store().ExpireLease(w.ctx, key))
				}
				done := fx.snapshot(key)

				res, err := c.wf.Run(w.ctx, retrying, key, order)
				require.NoError(t, err)
				require.Equal(t, want[c.wf.Name()], res.Response, "the retry answers what an uninterrupted run does")
				switch {
				case after.completed:
					require.True(t, res.Replayed)
					require.Equal(t, done, fx.snapshot(key), "a replay executes nothing")
				case after.absent:
					require.Equal(t, recovery.OutcomeNew, res.Outcome, "nothing was committed: the retry starts anew")
				default:
					require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
					require.Equal(t, after.point, res.ResumedFrom, "the retry resumes after the committed step")
				}
				fx.requireOnce(direct, key, c.wf, after.repeated...)

				again, err := c.wf.Run(w.ctx, retrying, key, order)
				require.NoError(t, err)
				require.True(t, again.Replayed)
				require.Equal(t, want[c.wf.Name()], again.Response)
				fx.requireOnce(direct, key, c.wf, after.repeated...)
			})
		}
	}
}

// loseAt runs c's workflow for key on an engine whose connections go
// through proxy, losing the request or the acknowledgement of c's
// statement, and returns the rule that did it. The caller sees an error.
func loseAt(t *testing.T, proxy *pgproxy.Proxy, pool *pgxpool.Pool, key workflow.Key, c commitPoint, fault pgproxy.Fault) *pgproxy.Armed {
	t.Helper()
	rule := pgproxy.Rule{Match: c.statement, Fault: fault}
	var armed *pgproxy.Armed
	if c.at == (workflow.CrashPoint{}) {
		armed = proxy.Arm(rule)
	}
	faulted := newEngine(t, pool, workflow.Config{Hooks: &workflow.Hooks{
		CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
			if p == c.at {
				armed = proxy.Arm(rule)
			}
			return nil
		}}})
	_, err := c.wf.Run(context.Background(), faulted, key, order)
	require.Error(t, err, "the caller sees an error")
	require.NotNil(t, armed, "the attempt passed %s", c.at)
	proxy.Disarm(armed)
	waitForOpenTransactions(t, pool)
	return armed
}

// waitForOpenTransactions returns once no other session of pool's database
// is in a transaction: a transaction whose connection was cut stays open
// until the server notices, holding its key's lock (migration 0017), so
// that a retry sent before then is rightly answered "in flight".
func waitForOpenTransactions(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var open int
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL`).Scan(&open))
		if open == 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "%d transactions stay open after the connection was cut", open)
		time.Sleep(time.Millisecond)
	}
}

// requireLeft checks what a fault left of key's record.
func requireLeft(t *testing.T, e *workflow.Engine, key workflow.Key, after aftermath) {
	t.Helper()
	rec, err := e.Store().Load(context.Background(), key)
	switch {
	case after.absent:
		require.ErrorIs(t, err, recovery.ErrNotFound, "the claim rolled back")
	case after.completed:
		require.NoError(t, err)
		require.Equal(t, recovery.StatusCompleted, rec.Status, "the completion committed")
	default:
		require.NoError(t, err)
		require.Equal(t, recovery.StatusInFlight, rec.Status)
		require.Equal(t, after.point, rec.RecoveryPoint, "what was committed")
		require.Equal(t, !after.held, rec.Released, "the attempt handed its lease back, or could not")
	}
}

// TestEveryAcknowledgementLost: each attempt of the ledger workflow loses
// a step's commit, so the workflow gets through only by retries whose
// callers all saw an error. When each attempt loses the acknowledgement of
// its first step commit, every commit is made by a different attempt and
// the run after the completion replays it; when each attempt loses the
// request of its second, each attempt commits one step and the last
// finishes. Either way each step takes effect once, and the response is
// the uninterrupted one.
//
// The rule matches the fenced write that records a step, not "commit": a
// takeover also commits its claim on its own, and losing that commit
// every time would lose every attempt before it starts.
func TestEveryAcknowledgementLost(t *testing.T) {
	for _, c := range []struct {
		fault    pgproxy.Fault
		skip     int      // step commits each attempt makes before the one it loses
		points   []string // the recovery point after each faulted attempt
		replayed bool     // the run after the last faulted attempt replays
		repeated []string // foreign steps called twice
	}{
		{pgproxy.LoseAcknowledgement, 0, []string{"create_order", "charge", "record_charge", "close"}, true, nil},
		{pgproxy.LoseRequest, 1, []string{"create_order", "charge", "record_charge"}, false, []string{"charge", "send_receipt"}},
	} {
		t.Run(c.fault.String(), func(t *testing.T) {
			w := newWorld(t)
			fx := newEffects(w)
			wf := fx.ledger()
			proxy, pool := w.proxied()
			direct := w.engine(workflow.Config{})
			e := newEngine(t, pool, workflow.Config{MaxAttempts: -1})

			var (
				points []string
				res    *workflow.Result
			)
			for range len(wf.Steps()) + 1 {
				armed := proxy.Arm(pgproxy.Rule{Match: stepCommit, Fault: c.fault, Skip: c.skip})
				var err error
				res, err = wf.Run(w.ctx, e, acme, order)
				proxy.Disarm(armed)
				if err == nil {
					require.Zero(t, armed.Fired())
					break
				}
				require.Equal(t, 1, armed.Fired(), "the attempt failed by the %s", c.fault)
				rec, err := direct.Store().Load(w.ctx, acme)
				require.NoError(t, err)
				points = append(points, rec.RecoveryPoint)
				require.True(t, rec.Finished() || rec.Released, "the attempt handed its lease back: the retry takes over at once")
			}
			require.Equal(t, c.points, points, "each attempt committed one step further")
			require.NotNil(t, res, "a run succeeded")
			require.Equal(t, c.replayed, res.Replayed)
			require.JSONEq(t, `{"steps":["create_order","charge","send_receipt","record_charge","close"]}`, string(res.Response.Body))
			fx.requireOnce(direct, acme, wf, c.repeated...)
		})
	}
}
