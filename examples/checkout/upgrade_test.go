package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/crashtest"
	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// This file proves with crashtest.Upgrade what a deploy of a changed
// checkout does to the checkouts in flight. The next releases' checkouts
// are declared here, from the app's own steps; the deployed one is the
// app's.

// upgradeWorld is one world of an upgrade experiment: a database with the
// checkout's tables, the fake payment provider over real HTTP, and the
// app on them.
type upgradeWorld struct {
	db       *pgxpool.Pool
	provider *provider
	app      *app
}

// upgradeTables are the tables of the steps only the next releases have.
const upgradeTables = `
CREATE TABLE stock_allocations (order_id text NOT NULL);
CREATE TABLE card_screenings (order_id text NOT NULL, charges_before int NOT NULL);`

func newUpgradeWorld(ctx context.Context, t *testing.T) (*upgradeWorld, error) {
	db := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{}), 8)
	if _, err := db.Exec(ctx, schemaSQL+upgradeTables); err != nil {
		return nil, err
	}
	p := newProvider()
	srv := httptest.NewServer(p.routes())
	t.Cleanup(srv.Close)
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		return nil, err
	}
	a := &app{db: db, outbox: ob, provider: srv.URL, client: srv.Client(), logger: slog.New(slog.DiscardHandler)}
	return &upgradeWorld{db: db, provider: p, app: a}, nil
}

// release declares a next release's checkout from steps, with the
// deployed release's point of no return: what a failure undoes is part of
// the definition, and a release that changed it would park records too.
func release(version string, steps ...phase.Step[CheckoutRequest, CheckoutState]) *workflow.Workflow[CheckoutRequest, CheckoutState] {
	return workflow.Define("checkout", steps...).Version(version).PointOfNoReturn("record_charge").Finish(paidResponse)
}

// allocateStock is a step a release adds after charge.
func (w *upgradeWorld) allocateStock() phase.Step[CheckoutRequest, CheckoutState] {
	return phase.Atomic("allocate_stock", func(ctx context.Context, tx pgx.Tx, r *phase.Run[CheckoutRequest, CheckoutState]) error {
		_, err := tx.Exec(ctx, `INSERT INTO stock_allocations (order_id) VALUES ($1)`, r.State.OrderID)
		return err
	})
}

// screenCard is a step a release inserts before charge: a card is to be
// screened before it is charged. It notes how many charges the provider
// had made when it ran, for the invariant to see.
func (w *upgradeWorld) screenCard() phase.Step[CheckoutRequest, CheckoutState] {
	return phase.Atomic("screen_card", func(ctx context.Context, tx pgx.Tx, r *phase.Run[CheckoutRequest, CheckoutState]) error {
		charges, _ := w.provider.counts()
		_, err := tx.Exec(ctx, `INSERT INTO card_screenings (order_id, charges_before) VALUES ($1, $2)`, r.State.OrderID, charges)
		return err
	})
}

// oneChargePerOrder is the invariant, whichever release finished the
// checkout: one order, paid by the one charge the provider made, one
// receipt queued; at most one stock allocation, and no card screened after
// it was charged.
func (w *upgradeWorld) oneChargePerOrder(ctx context.Context) error {
	var orders, allocations, screenings, screenedLate, receipts int
	var chargeID *string
	err := w.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM checkout_orders),
		(SELECT max(charge_id) FROM checkout_orders WHERE status = 'paid'),
		(SELECT count(*) FROM stock_allocations), (SELECT count(*) FROM card_screenings),
		(SELECT count(*) FROM card_screenings WHERE charges_before > 0),
		(SELECT count(*) FROM onceflow_outbox WHERE topic = 'receipt')`).
		Scan(&orders, &chargeID, &allocations, &screenings, &screenedLate, &receipts)
	if err != nil {
		return err
	}
	w.provider.mu.Lock()
	charges := slices.Clone(w.provider.charges)
	w.provider.mu.Unlock()
	var errs []error
	if orders != 1 || receipts != 1 {
		errs = append(errs, fmt.Errorf("%d orders and %d receipts queued; want one of each", orders, receipts))
	}
	if len(charges) != 1 || chargeID == nil || *chargeID != charges[0].ID {
		errs = append(errs, fmt.Errorf("the provider made %d charges %v; the paid order records %v", len(charges), charges, chargeID))
	}
	if allocations > 1 || screenings > 1 {
		errs = append(errs, fmt.Errorf("%d stock allocations and %d card screenings for one order", allocations, screenings))
	}
	if screenedLate > 0 {
		errs = append(errs, errors.New("the card was screened after it was charged"))
	}
	return errors.Join(errs...)
}

// upgrade explores a deploy of next over the app's checkout.
func upgrade(t *testing.T, next func(w *upgradeWorld) *workflow.Workflow[CheckoutRequest, CheckoutState]) *crashtest.UpgradeReport {
	return crashtest.Upgrade(t, crashtest.Case[CheckoutRequest, CheckoutState]{
		NewWorld: func(ctx context.Context) (*crashtest.World[CheckoutRequest, CheckoutState], error) {
			w, err := newUpgradeWorld(ctx, t)
			if err != nil {
				return nil, err
			}
			return &crashtest.World[CheckoutRequest, CheckoutState]{DB: w.db, Workflow: w.app.checkout(), Next: next(w),
				Check: w.oneChargePerOrder}, nil
		},
		Request: CheckoutRequest{CustomerID: "c-1", AmountCents: 1999, Currency: "usd", CardToken: "tok_visa",
			Items: []Item{{SKU: "sku-1", Qty: 1}}},
		// Order ids are random: a crash before create_order's commit makes
		// the recovery draw another.
		SameResponse: crashtest.SameResponseExcept("order_id"),
	})
}

func pointNames(points []workflow.CrashPoint) []string {
	names := []string{}
	for _, p := range points {
		names = append(names, p.String())
	}
	return names
}

// TestCheckoutSurvivesAStepAddedAfterCharge: a release that adds a step
// after charge resumes every checkout the deployed one left at any crash
// point, with one charge per order. In the rolling deploy's other
// direction, the deployed release parks the checkouts the new one left
// after its new step, which it cannot place.
func TestCheckoutSurvivesAStepAddedAfterCharge(t *testing.T) {
	t.Parallel()
	report := upgrade(t, func(w *upgradeWorld) *workflow.Workflow[CheckoutRequest, CheckoutState] {
		a := w.app
		return release("v2", phase.Atomic("create_order", a.createOrder), foreign.Mutation("charge", a.charge, foreign.Compensate(a.refund)),
			w.allocateStock(), phase.Atomic("record_charge", a.recordCharge))
	})
	require.NoError(t, report.Err())
	require.Len(t, report.Forward.Points, 8)
	require.Empty(t, report.Forward.Parked())
	require.Equal(t, report.Forward.Points, report.Forward.Resumed())
	require.Equal(t, []string{"after allocate_stock's commit", "before record_charge", "before record_charge's commit"},
		pointNames(report.Reverse.Parked()))
	require.Len(t, report.Reverse.Resumed(), len(report.Reverse.Points)-3)
}

// TestCheckoutParksAStepInsertedBeforeCharge: a release that inserts a
// step before charge cannot resume a checkout whose charge may have
// started: it parks every checkout the deployed one left after
// create_order's commit, and an operator's resume under the deployed
// release finishes each with one charge. A checkout that had not
// committed create_order, or had finished, is unaffected.
func TestCheckoutParksAStepInsertedBeforeCharge(t *testing.T) {
	t.Parallel()
	report := upgrade(t, func(w *upgradeWorld) *workflow.Workflow[CheckoutRequest, CheckoutState] {
		a := w.app
		return release("v2", phase.Atomic("create_order", a.createOrder), w.screenCard(),
			foreign.Mutation("charge", a.charge, foreign.Compensate(a.refund)), phase.Atomic("record_charge", a.recordCharge))
	})
	require.NoError(t, report.Err())
	require.Equal(t, []string{"after create_order's commit", "before charge", "after charge's call",
		"before record_charge", "before record_charge's commit"}, pointNames(report.Forward.Parked()))
	require.Equal(t, []string{"before create_order", "before create_order's commit", "after record_charge's commit"},
		pointNames(report.Forward.Resumed()))
	// The deployed release resumes a checkout the new one left before its
	// screening (the card goes unscreened), and parks one left after it.
	require.Equal(t, []string{"after screen_card's commit", "before charge", "after charge's call",
		"before record_charge", "before record_charge's commit"}, pointNames(report.Reverse.Parked()))
}
