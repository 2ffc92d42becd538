package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// side is one way of running the checkout: run executes one workflow for
// key, a key no other run of the side uses, and returns once it is done.
type side struct {
	name  string
	db    *database
	run   func(ctx context.Context, key string) error
	close func()
}

// newSide is how a side is built on its own database; workers is the most
// workflows it will be asked to run at once.
type newSide func(ctx context.Context, db *database, workers int) (*side, error)

// sides are the competitors, the floor first: every ratio is to it.
var sides = []struct {
	name string
	new  newSide
}{
	{"floor", newFloor},
	{"onceflow", newOnceflow},
	{"dbos", newDBOS},
	{"river", newRiver},
}

// The checkout's statements, the same on every side.
const (
	insertOrder = `INSERT INTO bench_orders (key, amount, status) VALUES ($1, $2, 'new') RETURNING id`
	markPaid    = `UPDATE bench_orders SET status = 'paid' WHERE id = $1`
	amount      = 100
)

// charge is the foreign call: a no-op, so that the figures measure what
// each side adds around it.
func charge(context.Context) error { return nil }

// newFloor runs the bare statements in the same two transactions, with no
// durability machinery: what the checkout costs at the least.
func newFloor(_ context.Context, db *database, _ int) (*side, error) {
	run := func(ctx context.Context, key string) error {
		var id int64
		if err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, insertOrder, key, amount).Scan(&id)
		}); err != nil {
			return err
		}
		if err := charge(ctx); err != nil {
			return err
		}
		return pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, markPaid, id)
			return err
		})
	}
	return &side{db: db, run: run, close: func() {}}, nil
}

// order and paid are onceflow's request and state.
type order struct {
	Amount int64 `json:"amount"`
}

type paid struct {
	OrderID int64 `json:"order_id"`
}

// newOnceflow runs the checkout as onceflow bench does: two atomic phases
// around a foreign mutation, keyed by the workflow's key.
func newOnceflow(ctx context.Context, db *database, _ int) (*side, error) {
	m, err := migrations.New(db.pool, migrations.Config{})
	if err != nil {
		return nil, err
	}
	if _, err := m.Up(ctx); err != nil {
		return nil, fmt.Errorf("onceflow migrations: %w", err)
	}
	engine, err := workflow.NewEngine(db.pool, workflow.Config{})
	if err != nil {
		return nil, err
	}
	wf := workflow.Define("checkout",
		phase.Atomic("create_order", func(ctx context.Context, tx pgx.Tx, r *phase.Run[order, paid]) error {
			return tx.QueryRow(ctx, insertOrder, r.Key.ID, r.Request.Amount).Scan(&r.State.OrderID)
		}),
		foreign.Mutation("charge", func(ctx context.Context, _ *foreign.Call[order, paid]) error { return charge(ctx) }),
		phase.Atomic("record_charge", func(ctx context.Context, tx pgx.Tx, r *phase.Run[order, paid]) error {
			_, err := tx.Exec(ctx, markPaid, r.State.OrderID)
			return err
		}),
	)
	run := func(ctx context.Context, key string) error {
		_, err := wf.Run(ctx, engine, workflow.Key{Tenant: "bench", ID: key}, order{Amount: amount})
		return err
	}
	return &side{db: db, run: run, close: func() {}}, nil
}
