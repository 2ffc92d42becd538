package workflow_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/pgtrace"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// Order is the checkout request the tests run.
type Order struct {
	Customer string `json:"customer"`
	Amount   int64  `json:"amount"`
	Card     string `json:"card"`
}

// Paid is the checkout's state.
type Paid struct {
	OrderID  int64  `json:"order_id"`
	ChargeID string `json:"charge_id,omitempty"`
	Declined bool   `json:"declined,omitempty"`
	Status   string `json:"status,omitempty"`
}

// provider is a fake payment provider that deduplicates by idempotency key
// and counts its effects.
type provider struct {
	mu      sync.Mutex
	charges map[string]string // key -> charge id
	calls   map[string]int    // key -> calls
	keys    []string          // keys in call order
}

func newProvider() *provider {
	return &provider{charges: map[string]string{}, calls: map[string]int{}}
}

func (p *provider) Charge(key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls[key]++
	p.keys = append(p.keys, key)
	if id, ok := p.charges[key]; ok {
		return id
	}
	id := fmt.Sprintf("ch_%d", len(p.charges)+1)
	p.charges[key] = id
	return id
}

func (p *provider) Effects() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}

// world is one test's database, provider and knobs.
type world struct {
	t        *testing.T
	ctx      context.Context
	db       *pgxpool.Pool
	counter  *pgtrace.Counter
	provider *provider

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
	cfg.MaxConns = 40
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	_, err = db.Exec(ctx, `
		CREATE TABLE orders (id bigserial PRIMARY KEY, customer text NOT NULL, amount bigint NOT NULL,
			status text NOT NULL, charge_id text);
		CREATE TABLE ledger (id bigserial PRIMARY KEY, order_id bigint NOT NULL, entry text NOT NULL)`)
	require.NoError(t, err)
	return &world{t: t, ctx: ctx, db: db, counter: counter, provider: newProvider()}
}

func (w *world) step(ctx context.Context, name string) error {
	if w.before == nil {
		return nil
	}
	return w.before(ctx, name)
}

// checkout declares create_order (atomic) → charge (foreign) →
// record_charge (atomic). A card "decline" is declined: record_charge marks
// the order declined and responds 402.
func (w *world) checkout() *workflow.Workflow[Order, Paid] {
	return workflow.Define("checkout",
		phase.Atomic("create_order", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			if err := w.step(ctx, r.Step); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `INSERT INTO orders (customer, amount, status) VALUES ($1, $2, 'new') RETURNING id`,
				r.Request.Customer, r.Request.Amount).Scan(&r.State.OrderID)
		}),
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[Order, Paid]) error {
			if err := w.step(ctx, c.Step); err != nil {
				return err
			}
			if c.Request.Card == "decline" {
				c.State.Declined = true
				return nil
			}
			c.State.ChargeID = w.provider.Charge(c.Key)
			return nil
		}),
		phase.Atomic("record_charge", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			if err := w.step(ctx, r.Step); err != nil {
				return err
			}
			if r.State.Declined {
				if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'declined' WHERE id = $1`, r.State.OrderID); err != nil {
					return err
				}
				return workflow.Respond(workflow.Problem(402, "card declined"))
			}
			r.State.Status = "paid"
			if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid', charge_id = $2 WHERE id = $1`,
				r.State.OrderID, r.State.ChargeID); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, entry) VALUES ($1, 'charged')`, r.State.OrderID)
			return err
		}),
	).Finish(func(s *Paid) workflow.Response { return workflow.JSON(201, s) })
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
