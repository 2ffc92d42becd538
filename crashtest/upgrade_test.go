package crashtest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

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

// screen is a step a later version inserts: it records a screening of the
// order, and says so in the response.
func screen() phase.Step[Order, State] {
	return phase.Atomic("screen", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, State]) error {
		r.State.Screened = true
		_, err := tx.Exec(ctx, `INSERT INTO screenings (order_id) VALUES ($1)`, r.State.OrderID)
		return err
	})
}

// sendReceipt is a step a later version adds after the last.
func sendReceipt(p *testapp.Provider) phase.Step[Order, State] {
	return foreign.Mutation("send_receipt", func(ctx context.Context, c *foreign.Call[Order, State]) error {
		id, err := testapp.Call(ctx, p.URL, "receipts", c.Key)
		c.State.ReceiptID = id
		return err
	})
}

// exactlyOnceAcrossVersions is exactlyOnce, and at most one of each effect
// only one version makes: a record the other version finished has none.
func exactlyOnceAcrossVersions(ctx context.Context, db *pgxpool.Pool, p *testapp.Provider) error {
	errs := []error{exactlyOnce(ctx, db, p)}
	var screenings int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM screenings`).Scan(&screenings); err != nil {
		return err
	}
	if screenings > 1 {
		errs = append(errs, fmt.Errorf("%d screenings of one order", screenings))
	}
	if n := p.Effects("receipts"); n > 1 {
		errs = append(errs, fmt.Errorf("%d receipts sent for one order", n))
	}
	return errors.Join(errs...)
}

// everyChargeRecorded is the invariant of a version without the charge:
// one order, reservation and payment row; at most one charge, and a charge
// made is the one the payment row records.
func everyChargeRecorded(ctx context.Context, db *pgxpool.Pool, p *testapp.Provider) error {
	var orders, reservations, payments, recorded int
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM reservations),
		(SELECT count(*) FROM payments), (SELECT count(*) FROM payments WHERE charge_id <> '')`).
		Scan(&orders, &reservations, &payments, &recorded); err != nil {
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
	if n := p.Effects("charges"); n > 1 || n != recorded {
		errs = append(errs, fmt.Errorf("%d charges made for one order, %d recorded", n, recorded))
	}
	return errors.Join(errs...)
}

// upgradeCase is a change from the test checkout (version v1) to next
// (version v2), and the crash points at which each direction must park.
type upgradeCase struct {
	name      string
	next      func(p *testapp.Provider) *workflow.Workflow[Order, State]
	invariant func(context.Context, *pgxpool.Pool, *testapp.Provider) error
	// forwardParks: v1 stopped there, v2 parks the record; reverseParks:
	// v2 stopped there, v1 parks it. Every other point resumes.
	forwardParks, reverseParks []string
}

func (uc upgradeCase) run(t *testing.T) {
	t.Parallel()
	report := crashtest.Upgrade(t, crashtest.Case[Order, State]{
		NewWorld: worlds(t, uc.invariant, func(p *testapp.Provider) (*workflow.Workflow[Order, State], *workflow.Workflow[Order, State]) {
			return checkout(p, derived).Version("v1"), uc.next(p).Version("v2")
		}),
		Request: Order{SKU: "sku-1", Amount: 1999},
	})
	require.NoError(t, report.Err())
	requireParksAt(t, report, uc.forwardParks, uc.reverseParks)
}

// requireParksAt checks that each direction of report parked at exactly
// the crash points given, and resumed at every other.
func requireParksAt(t *testing.T, report *crashtest.UpgradeReport, forwardParks, reverseParks []string) {
	t.Helper()
	for _, dir := range []struct {
		report *crashtest.Report
		parks  []string
	}{{report.Forward, forwardParks}, {report.Reverse, reverseParks}} {
		version := dir.report.Definition.Version
		require.Equal(t, dir.parks, pointNames(dir.report.Parked()), "%s stopped: parked", version)
		resumes := slices.DeleteFunc(pointNames(dir.report.Points), func(p string) bool { return slices.Contains(dir.parks, p) })
		require.Equal(t, resumes, pointNames(dir.report.Resumed()), "%s stopped: resumed", version)
	}
}

func pointNames(points []workflow.CrashPoint) []string {
	names := []string{}
	for _, p := range points {
		names = append(names, p.String())
	}
	return names
}

// afterRecordReservation are the crash points of the checkout whose
// recovery point is record_reservation: the charge may have started.
var afterRecordReservation = []string{"after record_reservation's commit", "before charge", "after charge's call",
	"before mark_paid", "before mark_paid's commit"}

// TestUpgradeCatchesUnsafeChanges: for each change that a record in flight
// cannot survive, Upgrade parks it at exactly the crash points whose
// record the new definition cannot place, and an operator's resume as the
// version that wrote it then finishes it: no effect repeated, none
// skipped. Every other crash point resumes.
func TestUpgradeCatchesUnsafeChanges(t *testing.T) {
	t.Parallel()
	for _, uc := range []upgradeCase{{
		// For a record after record_reservation, v2 would skip the
		// screening: its response would say nothing was screened.
		name: "a step inserted before the recovery point",
		next: func(p *testapp.Provider) *workflow.Workflow[Order, State] {
			return define(createOrder(), reserveStock(p), screen(), recordReservation(), chargeStep(p, "charge", derived), markPaid())
		},
		invariant:    exactlyOnceAcrossVersions,
		forwardParks: afterRecordReservation,
		// v1 cannot place a record after screen, a step it does not have.
		reverseParks: []string{"after screen's commit", "before record_reservation", "before record_reservation's commit",
			"after record_reservation's commit", "before charge", "after charge's call", "before mark_paid", "before mark_paid's commit"},
	}, {
		// charge_card would derive a key of its own and charge again.
		name: "a foreign step renamed without Renamed",
		next: func(p *testapp.Provider) *workflow.Workflow[Order, State] {
			return define(createOrder(), reserveStock(p), recordReservation(), chargeStep(p, "charge_card", derived), markPaid())
		},
		invariant:    exactlyOnceAcrossVersions,
		forwardParks: afterRecordReservation,
		reverseParks: []string{"after record_reservation's commit", "before charge_card", "after charge_card's call",
			"before mark_paid", "before mark_paid's commit"},
	}, {
		// v2 would mark the order paid without recording a charge that was
		// made.
		name: "a removed step that had started",
		next: func(p *testapp.Provider) *workflow.Workflow[Order, State] {
			return define(createOrder(), reserveStock(p), recordReservation(), markPaid()).Changes(workflow.Removed("charge"))
		},
		invariant:    everyChargeRecorded,
		forwardParks: afterRecordReservation,
		reverseParks: []string{}, // v1 has every step v2 has, in order
	}} {
		t.Run(uc.name, uc.run)
	}
}

// TestUpgradePassesSafeChanges: a change after what a record may have done
// resumes it, and a foreign step renamed with Renamed keeps deriving its
// key from its first name, so the provider deduplicates the charge a
// crashed attempt made.
func TestUpgradePassesSafeChanges(t *testing.T) {
	t.Parallel()
	for _, uc := range []upgradeCase{{
		name: "a step added after the last",
		next: func(p *testapp.Provider) *workflow.Workflow[Order, State] {
			return define(createOrder(), reserveStock(p), recordReservation(), chargeStep(p, "charge", derived), markPaid(), sendReceipt(p))
		},
		invariant:    exactlyOnceAcrossVersions,
		forwardParks: []string{},
		// Only the rolling deploy's other direction parks: v1 cannot
		// place a receipt that may have been sent.
		reverseParks: []string{"after mark_paid's commit", "before send_receipt", "after send_receipt's call"},
	}, {
		name: "a foreign step renamed with Renamed",
		next: func(p *testapp.Provider) *workflow.Workflow[Order, State] {
			return define(createOrder(), reserveStock(p), recordReservation(), chargeStep(p, "charge_card", derived), markPaid()).
				Changes(workflow.Renamed("charge", "charge_card"))
		},
		invariant:    exactlyOnceAcrossVersions,
		forwardParks: []string{},
		// v1 does not know the rename, but the record's definition says
		// charge_card derives its key from "charge", as v1's charge does:
		// v1 resumes it, and the provider deduplicates the charge.
		reverseParks: []string{},
	}} {
		t.Run(uc.name, uc.run)
	}
}

// TestUpgradeNeedsTwoDefinitions: an upgrade without a next definition,
// or to the same one, cannot be explored.
func TestUpgradeNeedsTwoDefinitions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		next func(p *testapp.Provider) *workflow.Workflow[Order, State]
		want string
	}{
		{func(*testapp.Provider) *workflow.Workflow[Order, State] { return nil }, "the world has no Next definition"},
		{func(p *testapp.Provider) *workflow.Workflow[Order, State] { return checkout(p, derived) }, "are one definition"},
	} {
		_, err := crashtest.ExploreUpgrade(context.Background(), crashtest.Case[Order, State]{
			NewWorld: worlds(t, exactlyOnce, func(p *testapp.Provider) (*workflow.Workflow[Order, State], *workflow.Workflow[Order, State]) {
				return checkout(p, derived), tc.next(p)
			}),
			Request: Order{SKU: "sku-1", Amount: 1999},
		})
		require.ErrorContains(t, err, tc.want)
	}
}

// undoing is how a version of the shared test checkout undoes a terminal
// failure: whether its charge is refunded (foreign.Compensate), and after
// which step, if any, nothing is undone.
type undoing struct {
	refund   bool
	noReturn string
}

// checkout is the shared test checkout, whose record_charge fails for
// good, undoing as u says.
func (u undoing) checkout(p *testapp.Provider, version string) *workflow.Workflow[testapp.Order, testapp.State] {
	opts := testapp.Options{Before: func(_ context.Context, step string) error {
		if step == "record_charge" {
			return phase.Permanent(errors.New("the ledger refuses the charge"))
		}
		return nil
	}}
	if u.refund {
		opts.Charge = []foreign.Option{foreign.Compensate(testapp.Refund(p.URL))}
	}
	wf := testapp.Checkout(p.URL, opts).Version(version)
	if u.noReturn != "" {
		wf.PointOfNoReturn(u.noReturn)
	}
	return wf
}

// chargedAndRefundedOnce is the invariant of a failing checkout whichever
// version undid it: one order, at most one charge and one refund, and a
// refund only of a charge made.
func chargedAndRefundedOnce(ctx context.Context, db *pgxpool.Pool, p *testapp.Provider) error {
	var orders int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		return err
	}
	var errs []error
	if orders != 1 {
		errs = append(errs, fmt.Errorf("%d orders for one request", orders))
	}
	if charges, refunds := p.Effects("charges"), p.Effects("refunds"); charges > 1 || refunds > charges {
		errs = append(errs, fmt.Errorf("%d charges and %d refunds for one order", charges, refunds))
	}
	for key, charge := range p.Undoes("refunds") {
		if !p.Made("charges", charge) {
			errs = append(errs, fmt.Errorf("refund %s undoes %q, a charge never made", key, charge))
		}
	}
	return errors.Join(errs...)
}

// TestUpgradeCatchesChangesToWhatIsUndone: a deploy that changes what a
// terminal failure undoes parks, in both directions, the records whose
// undo it would change: those that may have made the charge, or are
// refunding it. A point of no return moved past records that had passed
// it would refund charges the version that made them declared final, and
// a compensation dropped would leave unrefunded charges it would refund.
// The operator's resume as the version that wrote the record then finishes
// it as that version would. A record not yet charged resumes.
func TestUpgradeCatchesChangesToWhatIsUndone(t *testing.T) {
	t.Parallel()
	mayHaveCharged := []string{"after create_order's commit", "before charge", "after charge's call", "before record_charge"}
	refunding := append(slices.Clone(mayHaveCharged), "before undoing charge", "after charge's compensation call")
	for _, uc := range []struct {
		name                       string
		deployed, next             undoing
		forwardParks, reverseParks []string
	}{{
		name:     "the point of no return moved past records that had passed it",
		deployed: undoing{refund: true, noReturn: "create_order"}, next: undoing{refund: true},
		forwardParks: mayHaveCharged,
		// A record v2 is refunding is past v1's point of no return.
		reverseParks: refunding,
	}, {
		name:     "a compensation dropped",
		deployed: undoing{refund: true}, next: undoing{},
		forwardParks: refunding,
		reverseParks: mayHaveCharged,
	}} {
		t.Run(uc.name, func(t *testing.T) {
			t.Parallel()
			report := crashtest.Upgrade(t, crashtest.Case[testapp.Order, testapp.State]{
				NewWorld: func(ctx context.Context) (*crashtest.World[testapp.Order, testapp.State], error) {
					db := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{}), 8)
					if _, err := db.Exec(ctx, testapp.Schema); err != nil {
						return nil, err
					}
					p := testapp.NewProvider(t)
					return &crashtest.World[testapp.Order, testapp.State]{
						DB: db, Workflow: uc.deployed.checkout(p, "v1"), Next: uc.next.checkout(p, "v2"),
						Check: func(ctx context.Context) error { return chargedAndRefundedOnce(ctx, db, p) },
					}, nil
				},
				Request: testapp.Order{Customer: "ada", Amount: 1999, Card: "4242"},
			})
			require.NoError(t, report.Err())
			requireParksAt(t, report, uc.forwardParks, uc.reverseParks)
		})
	}
}
