package workflow_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// TestRejectAfterAForeignCallIsStored: once a foreign call ran, a Reject
// would delete the record and a retry would repeat the call under a new
// downstream key; so it is stored like Respond.
func TestRejectAfterAForeignCallIsStored(t *testing.T) {
	w := newWorld(t)
	wf := workflow.Define("charge_then_check",
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[Order, Paid]) error {
			id, err := w.charge(ctx, c.Key)
			c.State.ChargeID = id
			return err
		}),
		atomicStep("check", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error {
			return workflow.Reject(workflow.Problem(422, "too late"))
		}),
	)
	e := w.engine(workflow.Config{})
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.False(t, res.Rejected)
	require.Equal(t, 422, res.Response.Status)
	again, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, 1, w.provider.Effects("charges"))
}

// TestFirstAnswerIsTheReplayedAnswer: the caller that ran the workflow gets
// the response exactly as every replay will: allow-listed headers, an empty
// body rather than none.
func TestFirstAnswerIsTheReplayedAnswer(t *testing.T) {
	w := newWorld(t)
	wf := workflow.Define("headers", foreignStep("noop", func() error { return nil })).
		Finish(func(*Paid) workflow.Response {
			return workflow.Response{Status: 204, Header: http.Header{"content-type": {"x/y"}, "X-Internal": {"1"}}}
		})
	e := w.engine(workflow.Config{})
	first, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	replay, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Equal(t, replay.Response, first.Response)
	require.Equal(t, http.Header{"Content-Type": {"x/y"}}, first.Response.Header)
}

// TestHeartbeatDoesNotDeadlockAFullPool: with every connection held by
// steps, a renewal waiting for one must not keep the steps from finishing.
func TestHeartbeatDoesNotDeadlockAFullPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.NewDatabase(t, dbtest.Options{}))
	require.NoError(t, err)
	cfg.MaxConns = 1
	dbtest.CheckRouting(t, cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	db := &renewalsSent{Pool: pool, sent: make(chan struct{}, 1)}
	wf := workflow.Define("slow_phases",
		foreignStep("first", func() error { return nil }),
		atomicStep("long", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error {
			// The step holds the pool's only connection until a renewal
			// comes due and waits for it.
			select {
			case <-db.sent:
				return nil
			case <-time.After(30 * time.Second):
				return errors.New("no renewal was sent")
			}
		}),
	)
	// A lease long enough that the renewal's wait, not its loss, is what
	// the step ends with.
	e, err := workflow.NewEngine(db, workflow.Config{Lease: 3 * time.Second})
	require.NoError(t, err)
	runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := wf.Run(runCtx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, 200, res.Response.Status)
}

// renewalsSent signals each lease renewal the engine sends, before the
// renewal waits for a connection.
type renewalsSent struct {
	*pgxpool.Pool
	sent chan struct{}
}

func (r *renewalsSent) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if strings.Contains(sql, "RETURNING locked_until") {
		select {
		case r.sent <- struct{}{}:
		default:
		}
	}
	return r.Pool.QueryRow(ctx, sql, args...)
}

// TestCancelledCallerNeverFailsTheKey: a caller going away before anything
// took effect is not the work failing: even at MaxAttempts 1 the key stays
// resumable.
func TestCancelledCallerNeverFailsTheKey(t *testing.T) {
	w := newWorld(t)
	ctx, cancel := context.WithCancel(w.ctx)
	w.before = func(stepCtx context.Context, step string) error {
		if step == "create_order" { // the first phase: it rolls back
			cancel()
			<-stepCtx.Done()
			return stepCtx.Err()
		}
		return nil
	}
	wf := w.checkout()
	e := w.engine(workflow.Config{MaxAttempts: 1})
	_, err := wf.Run(ctx, e, acme, order)
	require.ErrorIs(t, err, context.Canceled)
	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusInFlight, rec.Status)
	require.True(t, rec.Released)
	require.Zero(t, rec.Attempts, "a caller that went away does not count")

	w.before = nil
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
}

// exploding fails to encode once it is marked.
type exploding struct{ Boom bool }

func (x exploding) MarshalJSON() ([]byte, error) {
	if x.Boom {
		panic("cannot encode")
	}
	return []byte(`{}`), nil
}

// TestPanicOutsideStepFunctionsRollsBack: a panic in the state's encoder,
// with the first phase's transaction open, rolls back, releases no
// connection to the void, and leaves a resumable record.
func TestPanicOutsideStepFunctionsRollsBack(t *testing.T) {
	w := newWorld(t)
	wf := workflow.Define("explode",
		phase.Atomic("mark", func(_ context.Context, _ pgx.Tx, r *phase.Run[Order, exploding]) error {
			r.State.Boom = true
			return nil
		}),
		phase.Atomic("never", func(context.Context, pgx.Tx, *phase.Run[Order, exploding]) error { return nil }),
	)
	e := w.engine(workflow.Config{})
	_, err := wf.Run(w.ctx, e, acme, order)
	var panicErr *phase.PanicError
	require.ErrorAs(t, err, &panicErr)
	require.Equal(t, "cannot encode", panicErr.Value)
	require.Zero(t, w.db.Stat().AcquiredConns(), "no connection is left in a transaction")
	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	require.True(t, rec.Released)
	require.Equal(t, 1, rec.Attempts)
}

// TestServerDefaultIsolationDoesNotMatter: the engine's transactions are
// READ COMMITTED even on a server that defaults to REPEATABLE READ, so
// racing duplicates see "in flight", never a serialization error.
func TestServerDefaultIsolationDoesNotMatter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := repeatableReadPool(t)
	_, err := db.Exec(ctx, `CREATE TABLE hits (n int)`)
	require.NoError(t, err)
	wf := workflow.Define("hit",
		phase.Atomic("hit", func(ctx context.Context, tx pgx.Tx, _ *phase.Run[Order, Paid]) error {
			_, err := tx.Exec(ctx, `INSERT INTO hits VALUES (1)`)
			return err
		}))
	e, err := workflow.NewEngine(db, workflow.Config{})
	require.NoError(t, err)
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		errs  = make(chan error, 16)
	)
	for range 16 {
		wg.Go(func() {
			<-start
			_, err := wf.Run(ctx, e, acme, order)
			if err != nil && !errors.Is(err, workflow.ErrInFlight) {
				errs <- err
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "only successes, replays and ErrInFlight")
	}
	var hits int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM hits`).Scan(&hits))
	require.Equal(t, 1, hits)
}

// repeatableReadPool returns a pool on a new database whose default
// isolation is REPEATABLE READ: the database's default, not a startup
// parameter, which PgBouncer refuses.
func repeatableReadPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbtest.NewDatabase(t, dbtest.Options{
		Settings: map[string]string{"default_transaction_isolation": "repeatable read"}}))
	require.NoError(t, err)
	dbtest.CheckRouting(t, cfg.ConnConfig)
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	return db
}

// TestPhaseSeesTheRecordAsItIsAtCommit: on a server that defaults to
// REPEATABLE READ, a phase's transaction still writes its recovery point
// after another commit changed the record during the phase (a lease
// renewal, here committed from another connection after the phase's
// first statement took its snapshot). Under REPEATABLE READ that write
// would fail with a serialization error (40001); the engine's transactions
// are READ COMMITTED, so it goes through. The second phase is not the
// first: its transaction is not the claim's.
func TestPhaseSeesTheRecordAsItIsAtCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := repeatableReadPool(t)
	_, err := db.Exec(ctx, `CREATE TABLE hits (step text)`)
	require.NoError(t, err)
	hit := func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
		_, err := tx.Exec(ctx, `INSERT INTO hits VALUES ($1)`, r.Step)
		return err
	}
	renewed := false
	wf := workflow.Define("renewed_mid_phase",
		phase.Atomic("first", hit),
		phase.Atomic("second", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			if err := hit(ctx, tx, r); err != nil { // the snapshot is taken
				return err
			}
			// What a renewal writes, committed while the phase runs.
			tag, err := db.Exec(ctx, `UPDATE onceflow_keys SET locked_until = locked_until + interval '1 second',
				updated_at = clock_timestamp() WHERE tenant_id = $1 AND key = $2 AND status = 'in_flight'`, r.Key.Tenant, r.Key.ID)
			renewed = err == nil && tag.RowsAffected() == 1
			return err
		}))
	e, err := workflow.NewEngine(db, workflow.Config{})
	require.NoError(t, err)
	res, err := wf.Run(ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, renewed, "the record was written during the second phase")
	require.False(t, res.Failed)
	rows, err := db.Query(ctx, `SELECT step FROM hits ORDER BY step`)
	require.NoError(t, err)
	steps, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"first", "second"}, steps)
	rec, err := e.Store().Load(ctx, acme)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusCompleted, rec.Status)
}

// failingRenewals fails the lease renewal statement while fail is set, as
// an unreachable database would.
type failingRenewals struct {
	*pgxpool.Pool
	fail atomic.Bool
}

func (f *failingRenewals) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if f.fail.Load() && strings.Contains(sql, "RETURNING locked_until") {
		return errRow{errors.New("connection refused")}
	}
	return f.Pool.QueryRow(ctx, sql, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// TestRenewalsFailingForALeaseStopTheStep: when no renewal succeeds for a
// whole lease, another attempt may be running the step: this one stops. The
// lease is long enough that a renewal is tried before it ends on a loaded
// machine; the test lasts about a lease.
func TestRenewalsFailingForALeaseStopTheStep(t *testing.T) {
	w := newWorld(t)
	const lease = time.Second
	db := &failingRenewals{Pool: w.db}
	failures := make(chan error, 100)
	wf := workflow.Define("long_call",
		foreign.Mutation("call", func(ctx context.Context, _ *foreign.Call[Order, Paid]) error {
			db.fail.Store(true)
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(30 * lease):
				return errors.New("the step was never cancelled")
			}
		}))
	e, err := workflow.NewEngine(db, workflow.Config{Lease: lease, Hooks: &workflow.Hooks{
		LeaseRenewed: func(_ workflow.Key, _ string, _ time.Time, err error) { failures <- err },
	}})
	require.NoError(t, err)
	_, err = wf.Run(w.ctx, e, acme, order)
	require.ErrorIs(t, err, workflow.ErrLeaseLost)
	require.ErrorContains(t, err, "no renewal succeeded for a whole lease")
	select { // the hooks have all run once Run returns
	case renewal := <-failures:
		require.Error(t, renewal, "renewals were tried and failed")
	default:
		require.Fail(t, "no renewal was tried")
	}
}
