package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/pgtrace"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// Order and Paid are the shared test checkout's request and state.
type (
	Order = testapp.Order
	Paid  = testapp.State
)

// world is one test's database, provider and knobs.
type world struct {
	t        *testing.T
	ctx      context.Context
	db       *pgxpool.Pool
	counter  *pgtrace.Counter
	provider *testapp.Provider

	// before runs at the start of every step with the step's name; a test
	// uses it to fail, block or panic at a step. Set it before running.
	before func(ctx context.Context, step string) error
}

func newWorld(t *testing.T) *world {
	t.Helper()
	t.Parallel()
	return newWorldOn(t, dbtest.NewDatabase(t, dbtest.Options{}))
}

// newSkewedWorld is a world whose database's clock is skew off the
// machine's, and so off the process's.
func newSkewedWorld(t *testing.T, skew time.Duration) *world {
	t.Helper()
	t.Parallel()
	return newWorldOn(t, dbtest.NewSkewedDatabase(t, skew, dbtest.Options{}))
}

func newWorldOn(t *testing.T, url string) *world {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	counter := &pgtrace.Counter{}
	cfg.ConnConfig.Tracer = counter
	dbtest.CheckRouting(t, cfg.ConnConfig)
	cfg.MaxConns = 40
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	_, err = db.Exec(ctx, testapp.Schema)
	require.NoError(t, err)
	return &world{t: t, ctx: ctx, db: db, counter: counter, provider: testapp.NewProvider(t)}
}

func (w *world) step(ctx context.Context, name string) error {
	if w.before == nil {
		return nil
	}
	return w.before(ctx, name)
}

// checkout is the shared test checkout, whose steps first call w.before:
// create_order (atomic) → charge (foreign) → record_charge (atomic). A
// card "decline" is declined: record_charge marks the order declined and
// responds 402.
func (w *world) checkout() *workflow.Workflow[Order, Paid] {
	return testapp.Checkout(w.provider.URL, testapp.Options{Before: w.step})
}

// charge charges at the provider with key and returns the charge's id.
func (w *world) charge(ctx context.Context, key string) (string, error) {
	return testapp.Call(ctx, w.provider.URL, "charges", key)
}

func (w *world) engine(cfg workflow.Config) *workflow.Engine {
	w.t.Helper()
	e, err := workflow.NewEngine(w.db, cfg)
	require.NoError(w.t, err)
	return e
}

func (w *world) count(sql string, args ...any) int {
	w.t.Helper()
	var n int
	require.NoError(w.t, w.db.QueryRow(w.ctx, sql, args...).Scan(&n))
	return n
}

func (w *world) orders() int { return w.count(`SELECT count(*) FROM orders`) }
func (w *world) ledger() int { return w.count(`SELECT count(*) FROM ledger`) }
func (w *world) keys() int   { return w.count(`SELECT count(*) FROM onceflow_keys`) }

var (
	acme  = workflow.Key{Tenant: "acme", ID: "order-1"}
	order = Order{Customer: "c-1", Amount: 1999, Card: "tok_visa"}
)

// foreignStep declares a foreign step that runs fn.
func foreignStep(name string, fn func() error) phase.Step[Order, Paid] {
	return foreign.Mutation(name, func(context.Context, *foreign.Call[Order, Paid]) error { return fn() })
}

// atomicStep declares an atomic step that runs fn.
func atomicStep(name string, fn func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error) phase.Step[Order, Paid] {
	return phase.Atomic(name, fn)
}
