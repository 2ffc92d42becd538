package crashtest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/crashtest"
	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// This file runs the README's crashtest snippet on the README's own
// Checkout (section "Workflows"), with the harness a user's test would
// declare around it: the orders table, a fake payment service, and the
// invariant.

type CheckoutRequest struct {
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

type CheckoutState struct {
	OrderID  int64  `json:"order_id"`
	ChargeID string `json:"charge_id,omitempty"`
}

// The README's Checkout.
var Checkout = workflow.Define("checkout",
	phase.Atomic("create_order", func(ctx context.Context, tx pgx.Tx, r *phase.Run[CheckoutRequest, CheckoutState]) error {
		return tx.QueryRow(ctx, `INSERT INTO orders (customer, amount_cents) VALUES ($1, $2) RETURNING id`,
			r.Request.Customer, r.Request.AmountCents).Scan(&r.State.OrderID)
	}),
	foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[CheckoutRequest, CheckoutState]) error {
		ch, err := payments.Charge(ctx, c.Key, c.Request.AmountCents) // c.Key: the same on every attempt
		if err != nil {
			return err
		}
		c.State.ChargeID = ch.ID
		return nil
	}),
	phase.Atomic("record_charge", func(ctx context.Context, tx pgx.Tx, r *phase.Run[CheckoutRequest, CheckoutState]) error {
		_, err := tx.Exec(ctx, `UPDATE orders SET charge_id = $2 WHERE id = $1`, r.State.OrderID, r.State.ChargeID)
		return err
	}),
).Finish(func(s *CheckoutState) workflow.Response { return workflow.JSON(201, s) })

// payments is the payment service the README's Checkout calls; each world
// replaces it with a new fake.
var payments *fakePayments

// fakePayments is the README's payment client, on the shared test
// provider.
type fakePayments struct{ *testapp.Provider }

type charge struct{ ID string }

func newFakePayments(t *testing.T) *fakePayments { return &fakePayments{testapp.NewProvider(t)} }

func (p *fakePayments) Charge(ctx context.Context, key string, _ int64) (*charge, error) {
	id, err := testapp.Call(ctx, p.URL, "charges", key)
	if err != nil {
		return nil, err
	}
	return &charge{ID: id}, nil
}

const ordersTable = `CREATE TABLE orders (id bigserial PRIMARY KEY, customer text NOT NULL,
	amount_cents bigint NOT NULL, charge_id text)`

// oneChargePerOrder: one order, charged, and one charge made.
func oneChargePerOrder(ctx context.Context, db *pgxpool.Pool, p *fakePayments) error {
	var orders, charged int
	if err := db.QueryRow(ctx, `SELECT count(*), count(charge_id) FROM orders`).Scan(&orders, &charged); err != nil {
		return err
	}
	var errs []error
	if orders != 1 || charged != 1 {
		errs = append(errs, fmt.Errorf("%d orders, %d of them charged; want one, charged", orders, charged))
	}
	if n := p.Effects("charges"); n != 1 {
		errs = append(errs, fmt.Errorf("%d charges made for one order", n))
	}
	return errors.Join(errs...)
}

func TestReadmeCrashtestSnippet(t *testing.T) {
	// Not parallel: the README's Checkout reaches its payment service
	// through a package variable, which each world replaces.
	report := crashtest.Run(t, crashtest.Case[CheckoutRequest, CheckoutState]{
		NewWorld: func(ctx context.Context) (*crashtest.World[CheckoutRequest, CheckoutState], error) {
			db := crashtest.FreshDatabase(t, "") // a migrated database of its own on $ONCEFLOW_DATABASE_URL's server
			if _, err := db.Exec(ctx, ordersTable); err != nil {
				return nil, err
			}
			payments = newFakePayments(t) // the service Checkout calls
			return &crashtest.World[CheckoutRequest, CheckoutState]{DB: db, Workflow: Checkout, Close: db.Close,
				Check: func(ctx context.Context) error { return oneChargePerOrder(ctx, db, payments) }}, nil
		},
		Request: CheckoutRequest{Customer: "c-1", AmountCents: 1999},
		// A crash before create_order's commit skips the order id its attempt drew.
		SameResponse: crashtest.SameResponseExcept("order_id"),
	})
	require.NoError(t, report.Err())
	require.Len(t, report.Points, 8, "%v", report.Points)
}
