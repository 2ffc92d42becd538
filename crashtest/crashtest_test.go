package crashtest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/crashtest"
	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

type Order struct {
	SKU    string `json:"sku"`
	Amount int64  `json:"amount"`
}

type State struct {
	OrderID       int64  `json:"order_id"`
	ReservationID string `json:"reservation_id,omitempty"`
	ChargeID      string `json:"charge_id,omitempty"`
	// Screened and ReceiptID are set by steps only later versions have
	// (upgrade_test.go).
	Screened  bool   `json:"screened,omitempty"`
	ReceiptID string `json:"receipt_id,omitempty"`
}

// checkout has three atomic phases and two foreign mutations, calling the
// shared test provider: a shape with more crash points than the shared
// test checkout's. chargeKey picks the key the charge sends: a correct
// workflow sends the derived key.
func checkout(p *testapp.Provider, chargeKey func(c *foreign.Call[Order, State]) string) *workflow.Workflow[Order, State] {
	return define(createOrder(), reserveStock(p), recordReservation(), chargeStep(p, "charge", chargeKey), markPaid())
}

// define declares a version of the checkout from its steps.
func define(steps ...phase.Step[Order, State]) *workflow.Workflow[Order, State] {
	return workflow.Define("checkout", steps...).Finish(func(s *State) workflow.Response { return workflow.JSON(201, s) })
}

func createOrder() phase.Step[Order, State] {
	return phase.Atomic("create_order", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, State]) error {
		return tx.QueryRow(ctx, `INSERT INTO orders (id, sku, amount)
			SELECT coalesce(max(id), 0) + 1, $1, $2 FROM orders RETURNING id`,
			r.Request.SKU, r.Request.Amount).Scan(&r.State.OrderID)
	})
}

func reserveStock(p *testapp.Provider) phase.Step[Order, State] {
	return foreign.Mutation("reserve_stock", func(ctx context.Context, c *foreign.Call[Order, State]) error {
		id, err := testapp.Call(ctx, p.URL, "reservations", c.Key)
		c.State.ReservationID = id
		return err
	})
}

func recordReservation() phase.Step[Order, State] {
	return phase.Atomic("record_reservation", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, State]) error {
		_, err := tx.Exec(ctx, `INSERT INTO reservations (order_id, reservation_id) VALUES ($1, $2)`,
			r.State.OrderID, r.State.ReservationID)
		return err
	})
}

// chargeStep is the charge step, named name.
func chargeStep(p *testapp.Provider, name string, chargeKey func(c *foreign.Call[Order, State]) string) phase.Step[Order, State] {
	return foreign.Mutation(name, func(ctx context.Context, c *foreign.Call[Order, State]) error {
		id, err := testapp.Call(ctx, p.URL, "charges", chargeKey(c))
		c.State.ChargeID = id
		return err
	})
}

func markPaid() phase.Step[Order, State] {
	return phase.Atomic("mark_paid", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, State]) error {
		_, err := tx.Exec(ctx, `INSERT INTO payments (order_id, charge_id) VALUES ($1, $2)`, r.State.OrderID, r.State.ChargeID)
		return err
	})
}

// newWorld builds a fresh database and provider, and the invariant: one row
// per business effect, one effect per downstream operation.
func newWorld(t *testing.T, chargeKey func(c *foreign.Call[Order, State]) string) func(context.Context) (*crashtest.World[Order, State], error) {
	return worlds(t, exactlyOnce, func(p *testapp.Provider) (*workflow.Workflow[Order, State], *workflow.Workflow[Order, State]) {
		return checkout(p, chargeKey), nil
	})
}

// worlds builds fresh worlds: a database with the checkout's tables, a
// provider, the definitions versions declares on it, and invariant.
func worlds(t *testing.T, invariant func(context.Context, *pgxpool.Pool, *testapp.Provider) error,
	versions func(p *testapp.Provider) (current, next *workflow.Workflow[Order, State]),
) func(context.Context) (*crashtest.World[Order, State], error) {
	return func(ctx context.Context) (*crashtest.World[Order, State], error) {
		db := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{}), 8)
		// Orders are numbered transactionally: a sequence would skip the
		// number an attempt drew before its transaction rolled back, and the
		// recovered response would differ from the uncrashed one.
		if _, err := db.Exec(ctx, `
			CREATE TABLE orders (id bigint PRIMARY KEY, sku text NOT NULL, amount bigint NOT NULL);
			CREATE TABLE reservations (order_id bigint NOT NULL, reservation_id text NOT NULL);
			CREATE TABLE payments (order_id bigint NOT NULL, charge_id text NOT NULL);
			CREATE TABLE screenings (order_id bigint NOT NULL)`); err != nil {
			return nil, err
		}
		p := testapp.NewProvider(t)
		current, next := versions(p)
		return &crashtest.World[Order, State]{
			DB:       db,
			Workflow: current,
			Next:     next,
			Check:    func(ctx context.Context) error { return invariant(ctx, db, p) },
		}, nil
	}
}

func exactlyOnce(ctx context.Context, db *pgxpool.Pool, p *testapp.Provider) error {
	var orders, reservations, payments int
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM reservations),
		(SELECT count(*) FROM payments)`).Scan(&orders, &reservations, &payments); err != nil {
		return err
	}
	var errs []error
	if orders != 1 || reservations != 1 || payments != 1 {
		errs = append(errs, fmt.Errorf("rows: %d orders, %d reservations, %d payments; want exactly one each",
			orders, reservations, payments))
	}
	if n := p.Effects("reservations"); n != 1 {
		errs = append(errs, fmt.Errorf("%d stock reservations made for one order", n))
	}
	if n := p.Effects("charges"); n != 1 {
		errs = append(errs, fmt.Errorf("%d charges made for one order", n))
	}
	return errors.Join(errs...)
}

func derived(c *foreign.Call[Order, State]) string { return c.Key }

func TestCheckoutSurvivesEveryCrash(t *testing.T) {
	t.Parallel()
	report := crashtest.Run(t, crashtest.Case[Order, State]{
		NewWorld: newWorld(t, derived),
		Request:  Order{SKU: "sku-1", Amount: 1999},
	})
	require.NoError(t, report.Err())
	require.JSONEq(t, `{"order_id":1,"reservation_id":"re_1","charge_id":"ch_1"}`, string(report.Response.Body))
	require.Empty(t, report.Unreached)
	require.Len(t, report.Points, 13, "every crash point of the definition: %v", report.Points)
	require.Len(t, report.Outcomes, 26)
	require.Equal(t, workflow.CrashPoints(checkout(nil, derived)), report.Points)
}

// TestHarnessCatchesIgnoredKey: a charge that ignores the derived key (a
// fresh key per call) charges twice when it runs again after a crash, and
// the harness must say so.
func TestHarnessCatchesIgnoredKey(t *testing.T) {
	t.Parallel()
	report, err := crashtest.Explore(context.Background(), crashtest.Case[Order, State]{
		NewWorld: newWorld(t, func(*foreign.Call[Order, State]) string { return uuid.NewString() }),
		Request:  Order{SKU: "sku-1", Amount: 1999},
	})
	require.NoError(t, err, "the uncrashed run is fine")
	failed := map[string]bool{}
	for _, o := range report.Outcomes {
		if o.Err != nil {
			failed[o.Point.String()] = true
			require.ErrorContains(t, o.Err, "2 charges made for one order")
		}
	}
	require.True(t, failed["after charge's call"], "failures: %v", report.Err())
	require.Error(t, report.Err())
}

// TestHarnessCatchesWritesOutsideTheTransaction: a first phase that writes
// with the pool instead of its transaction keeps its row when the attempt
// dies before the commit; the recovery writes it again.
func TestHarnessCatchesWritesOutsideTheTransaction(t *testing.T) {
	t.Parallel()
	newWorld := func(ctx context.Context) (*crashtest.World[Order, State], error) {
		db := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{}), 8)
		if _, err := db.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY, sku text NOT NULL, amount bigint NOT NULL)`); err != nil {
			return nil, err
		}
		wf := workflow.Define("leaky",
			phase.Atomic("create_order", func(ctx context.Context, _ pgx.Tx, r *phase.Run[Order, State]) error {
				return db.QueryRow(ctx, `INSERT INTO orders (id, sku, amount) SELECT coalesce(max(id), 0) + 1, $1, $2
					FROM orders RETURNING id`, r.Request.SKU, r.Request.Amount).Scan(&r.State.OrderID)
			}),
		)
		return &crashtest.World[Order, State]{DB: db, Workflow: wf, Check: func(ctx context.Context) error {
			var n int
			if err := db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil {
				return err
			}
			if n != 1 {
				return fmt.Errorf("%d orders for one request", n)
			}
			return nil
		}}, nil
	}
	report, err := crashtest.Explore(context.Background(), crashtest.Case[Order, State]{
		NewWorld: newWorld, Request: Order{SKU: "sku-1", Amount: 1},
		SameResponse: func(want, got workflow.Response) error { return nil }, // only the invariant matters here
	})
	require.NoError(t, err)
	failed := map[string]bool{}
	for _, o := range report.Outcomes {
		if o.Err != nil {
			failed[o.Point.String()] = true
			require.ErrorContains(t, o.Err, "2 orders for one request")
		}
	}
	require.Equal(t, map[string]bool{"before create_order's commit": true}, failed)
}
