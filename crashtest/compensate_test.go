package crashtest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/crashtest"
	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// refund is a compensation of the shared test checkout's charge, given the
// world's database and provider.
type refund func(db *pgxpool.Pool, p *testapp.Provider) func(context.Context, *foreign.Call[testapp.Order, testapp.State]) error

// keyedRefund refunds the charge with the compensation's derived key.
func keyedRefund(_ *pgxpool.Pool, p *testapp.Provider) func(context.Context, *foreign.Call[testapp.Order, testapp.State]) error {
	return testapp.Refund(p.URL)
}

// refundWorlds builds fresh worlds running the shared test checkout, whose
// charge undo compensates; fail makes record_charge fail for good, before
// the point of no return, so the charge is undone.
func refundWorlds(t *testing.T, fail bool, undo refund) func(context.Context) (*crashtest.World[testapp.Order, testapp.State], error) {
	return func(ctx context.Context) (*crashtest.World[testapp.Order, testapp.State], error) {
		db := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{}), 8)
		if _, err := db.Exec(ctx, testapp.Schema); err != nil {
			return nil, err
		}
		p := testapp.NewProvider(t)
		wf := testapp.Checkout(p.URL, testapp.Options{
			Before: func(_ context.Context, step string) error {
				if fail && step == "record_charge" {
					return phase.Permanent(errors.New("the ledger refuses the charge"))
				}
				return nil
			},
			Charge: []foreign.Option{foreign.Compensate(undo(db, p))},
		}).PointOfNoReturn("record_charge")
		return &crashtest.World[testapp.Order, testapp.State]{
			DB: db, Workflow: wf,
			Check: func(ctx context.Context) error { return chargeXorRefund(ctx, db, p, crashKey) },
		}, nil
	}
}

// crashKey is the key a Case without one runs under.
var crashKey = workflow.Key{Tenant: "crashtest", ID: "crashtest-1"}

// chargeXorRefund is the invariant of a checkout whose charge is refunded
// when it fails for good. The key's order exists once, and either it is
// paid, with one charge and no refund, or it is not, and every charge is
// refunded: at most one charge effect, as many refund effects. Each
// refund names a charge the provider made, and the books never hold more
// refunds than the provider made. The world runs this one key, so the
// provider's effects are the key's.
func chargeXorRefund(ctx context.Context, db *pgxpool.Pool, p *testapp.Provider, key workflow.Key) error {
	var orders, paid, booked int
	if err := db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'paid'),
		(SELECT count(*) FROM ledger WHERE entry = 'refunded')
		FROM orders WHERE tenant = $1 AND key = $2`, key.Tenant, key.ID).Scan(&orders, &paid, &booked); err != nil {
		return err
	}
	charges, refunds := p.Effects("charges"), p.Effects("refunds")
	var errs []error
	switch {
	case orders != 1:
		errs = append(errs, fmt.Errorf("%d orders for one request", orders))
	case paid == 1 && (charges != 1 || refunds != 0):
		errs = append(errs, fmt.Errorf("the order is paid with %d charges and %d refunds; want one charge, no refund", charges, refunds))
	case paid == 0 && (charges > 1 || refunds != charges):
		errs = append(errs, fmt.Errorf("the order is not paid, with %d charges and %d refunds; want at most one charge, refunded once", charges, refunds))
	}
	for key, charge := range p.Undoes("refunds") {
		if !p.Made("charges", charge) {
			errs = append(errs, fmt.Errorf("refund %s undoes %q, a charge never made", key, charge))
		}
	}
	if booked > refunds {
		errs = append(errs, fmt.Errorf("the books hold %d refunds, the provider made %d", booked, refunds))
	}
	return errors.Join(errs...)
}

// compensationPath are the crash points of the checkout's compensation.
func compensationPath() []workflow.CrashPoint {
	return workflow.CompensationPoints(testapp.Checkout("", testapp.Options{Charge: []foreign.Option{
		foreign.Compensate(func(context.Context, *foreign.Call[testapp.Order, testapp.State]) error { return nil }),
	}}))
}

// TestRefundSurvivesEveryCrash: record_charge fails for good after the
// charge, so the charge is refunded. Every point of the forward path and of
// the refund is crashed at, each recovered by a retry and by a resume:
// the charge is refunded exactly once, the order is not paid, and every
// recovery answers the stored failure, compensated.
func TestRefundSurvivesEveryCrash(t *testing.T) {
	t.Parallel()
	report := crashtest.Run(t, crashtest.Case[testapp.Order, testapp.State]{
		NewWorld: refundWorlds(t, true, keyedRefund),
		Request:  testapp.Order{Customer: "ada", Amount: 1999, Card: "4242"},
	})
	require.NoError(t, report.Err())
	require.True(t, report.Compensated)
	require.False(t, report.Failed)
	require.Equal(t, 500, report.Response.Status)

	forward := []workflow.CrashPoint{
		{Kind: workflow.BeforeStep, Step: "create_order"}, {Kind: workflow.BeforeCommit, Step: "create_order"},
		{Kind: workflow.AfterCommit, Step: "create_order"}, {Kind: workflow.BeforeStep, Step: "charge"},
		{Kind: workflow.AfterForeignCall, Step: "charge"}, {Kind: workflow.BeforeStep, Step: "record_charge"},
	}
	require.Equal(t, append(forward, compensationPath()...), report.Points)
	require.Equal(t, []workflow.CrashPoint{
		{Kind: workflow.BeforeCommit, Step: "record_charge"}, {Kind: workflow.AfterCommit, Step: "record_charge"},
	}, report.Unreached, "the failing step's commit is never reached; no compensation is missing")
	require.Len(t, report.Outcomes, 2*len(report.Points))
}

// TestRefundableCheckoutThatSucceedsSurvivesEveryCrash: the same checkout,
// whose record_charge succeeds, is paid with one charge and no refund after
// every crash; its compensation points are not reported as unreached.
func TestRefundableCheckoutThatSucceedsSurvivesEveryCrash(t *testing.T) {
	t.Parallel()
	report := crashtest.Run(t, crashtest.Case[testapp.Order, testapp.State]{
		NewWorld:     refundWorlds(t, false, keyedRefund),
		Request:      testapp.Order{Customer: "ada", Amount: 1999, Card: "4242"},
		SameResponse: crashtest.SameResponseExcept("order_id"), // from a sequence
	})
	require.NoError(t, report.Err())
	require.False(t, report.Compensated)
	require.Equal(t, 201, report.Response.Status)
	require.Empty(t, report.Unreached)
	for _, p := range compensationPath() {
		require.NotContains(t, report.Points, p)
	}
}

// exploreBrokenRefund explores the failing checkout with undo as the
// charge's compensation, and returns the points whose experiments failed.
// Every failure must be on the compensation path and say so with
// complaint.
func exploreBrokenRefund(t *testing.T, undo refund, complaint string) []workflow.CrashPoint {
	t.Helper()
	report, err := crashtest.Explore(context.Background(), crashtest.Case[testapp.Order, testapp.State]{
		NewWorld: refundWorlds(t, true, undo),
		Request:  testapp.Order{Customer: "ada", Amount: 1999, Card: "4242"},
	})
	require.NoError(t, err, "the uncrashed run is fine")
	require.Error(t, report.Err())
	var failed []workflow.CrashPoint
	for _, o := range report.Outcomes {
		if o.Err == nil {
			continue
		}
		require.Contains(t, compensationPath(), o.Point, "a forward point failed: %v", o.Err)
		require.ErrorContains(t, o.Err, complaint)
		if !slices.Contains(failed, o.Point) {
			failed = append(failed, o.Point)
		}
	}
	t.Logf("caught at %v", failed)
	return failed
}

// TestHarnessCatchesARefundThatIgnoresItsKey: a refund sent with a fresh
// key per call refunds twice when the compensation runs again after a
// crash between its call and its commit.
func TestHarnessCatchesARefundThatIgnoresItsKey(t *testing.T) {
	t.Parallel()
	freshKey := func(_ *pgxpool.Pool, p *testapp.Provider) func(context.Context, *foreign.Call[testapp.Order, testapp.State]) error {
		return func(ctx context.Context, c *foreign.Call[testapp.Order, testapp.State]) error {
			_, err := testapp.CallUndoing(ctx, p.URL, "refunds", uuid.NewString(), c.Compensates)
			return err
		}
	}
	failed := exploreBrokenRefund(t, freshKey, "2 refunds")
	require.Contains(t, failed, workflow.CrashPoint{Kind: workflow.AfterCompensationCall, Step: "charge"})
}

// TestHarnessCatchesARefundBookedTwice: a refund that is idempotent at the
// provider but books itself with a plain INSERT (a compensation has no
// transaction of its own) books twice when it runs again after a crash.
func TestHarnessCatchesARefundBookedTwice(t *testing.T) {
	t.Parallel()
	booksTwice := func(db *pgxpool.Pool, p *testapp.Provider) func(context.Context, *foreign.Call[testapp.Order, testapp.State]) error {
		return func(ctx context.Context, c *foreign.Call[testapp.Order, testapp.State]) error {
			if err := testapp.Refund(p.URL)(ctx, c); err != nil {
				return err
			}
			_, err := db.Exec(ctx, `INSERT INTO ledger (order_id, entry) VALUES ($1, 'refunded')`, c.State.OrderID)
			return err
		}
	}
	failed := exploreBrokenRefund(t, booksTwice, "the books hold 2 refunds")
	require.Contains(t, failed, workflow.CrashPoint{Kind: workflow.AfterCompensationCall, Step: "charge"})
}
