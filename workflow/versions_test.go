package workflow_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// spec builds a definition of steps written as "name:A" (atomic),
// "name:F" (foreign) or "name:FC" (foreign, with a compensation), with
// changes.
func spec(t *testing.T, version string, steps []string, changes ...workflow.Change) workflow.Spec {
	t.Helper()
	return define(version, steps).Changes(changes...).Spec()
}

// specNoReturn is spec with a point of no return after step noReturn.
func specNoReturn(t *testing.T, version string, steps []string, noReturn string) workflow.Spec {
	t.Helper()
	return define(version, steps).PointOfNoReturn(noReturn).Spec()
}

func define(version string, steps []string) *workflow.Workflow[Order, Paid] {
	var ps []phase.Step[Order, Paid]
	for _, s := range steps {
		name, kind, _ := strings.Cut(s, ":")
		switch kind {
		case "A":
			ps = append(ps, phase.Atomic(name, func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil }))
		case "F":
			ps = append(ps, phase.Foreign(name, func(context.Context, *phase.Run[Order, Paid]) error { return nil }))
		case "FC":
			ps = append(ps, phase.Foreign(name, func(context.Context, *phase.Run[Order, Paid]) error { return nil }).
				Compensate(func(context.Context, *phase.Run[Order, Paid]) error { return nil }))
		}
	}
	return workflow.Define("checkout", ps...).Version(version)
}

// TestResumable: every rule of a resume under a changed definition, on the
// checkout's shape (create_order, charge, record_charge).
func TestResumable(t *testing.T) {
	v1 := spec(t, "v1", []string{"create_order:A", "charge:F", "record_charge:A"})
	cases := []struct {
		name  string
		cur   workflow.Spec
		point string
		want  string // the recovery point to resume after
		parks bool
	}{
		{name: "a step added after the last", point: "record_charge",
			cur: spec(t, "v2", []string{"create_order:A", "charge:F", "record_charge:A", "send_receipt:F"}), want: "record_charge"},
		{name: "a step added after charge, record before it", point: "create_order",
			cur: spec(t, "v2", []string{"create_order:A", "charge:F", "audit:A", "record_charge:A"}), want: "create_order"},
		{name: "a step inserted before the recovery point", point: "record_charge", parks: true,
			cur: spec(t, "v2", []string{"create_order:A", "fraud_check:F", "charge:F", "record_charge:A"})},
		{name: "a step inserted before a charge that may have started", point: "create_order", parks: true,
			cur: spec(t, "v2", []string{"create_order:A", "fraud_check:F", "charge:F", "record_charge:A"})},
		{name: "a step inserted before the first, nothing committed", point: "",
			cur: spec(t, "v2", []string{"validate:A", "create_order:A", "charge:F", "record_charge:A"}), want: ""},
		{name: "a foreign step renamed without Renamed", point: "create_order", parks: true,
			cur: spec(t, "v2", []string{"create_order:A", "charge_card:F", "record_charge:A"})},
		{name: "a foreign step renamed with Renamed", point: "record_charge",
			cur: spec(t, "v2", []string{"create_order:A", "charge_card:F", "record_charge:A"},
				workflow.Renamed("charge", "charge_card")), want: "record_charge"},
		{name: "the recovery point renamed with Renamed", point: "create_order",
			cur: spec(t, "v2", []string{"make_order:A", "charge:F", "record_charge:A"},
				workflow.Renamed("create_order", "make_order")), want: "make_order"},
		{name: "a step's kind changed before the recovery point", point: "record_charge", parks: true,
			cur: spec(t, "v2", []string{"create_order:A", "charge:A", "record_charge:A"})},
		{name: "a removed step that had completed", point: "record_charge", parks: true,
			cur: spec(t, "v2", []string{"create_order:A", "record_charge:A"}, workflow.Removed("charge"))},
		{name: "a removed foreign step that may have started", point: "create_order", parks: true,
			cur: spec(t, "v2", []string{"create_order:A", "record_charge:A"}, workflow.Removed("charge"))},
		{name: "a removed atomic step that had not started", point: "charge",
			cur: spec(t, "v2", []string{"create_order:A", "charge:F"}, workflow.Removed("record_charge")), want: "charge"},
		{name: "steps reordered after the recovery point", point: "create_order",
			cur: spec(t, "v2", []string{"create_order:A", "charge:F", "b:A", "a:A"}), want: "create_order"},
		{name: "a recovery point the old definition lacks", point: "nope", parks: true,
			cur: spec(t, "v2", []string{"create_order:A", "charge:F", "record_charge:A"})},
	}
	for _, tc := range cases {
		got, why := workflow.Resumable(v1, tc.point, tc.cur)
		if tc.parks {
			require.NotEmpty(t, why, tc.name)
			continue
		}
		require.Empty(t, why, tc.name)
		require.Equal(t, tc.want, got, tc.name)
	}
}

// TestDefinitionFingerprint: the fingerprint follows the step names, kinds,
// order and version, and nothing else.
func TestDefinitionFingerprint(t *testing.T) {
	base := spec(t, "", []string{"a:A", "b:F"})
	require.Len(t, base.Fingerprint, 32)
	require.Equal(t, "11757b82bc6fac18ac8be3bef62a26cb", base.Earlier.Fingerprint,
		"the fingerprint builds from before Compensation gave it, which records they stamped name")
	require.Equal(t, base.Earlier.Fingerprint, specNoReturn(t, "", []string{"a:A", "b:FC"}, "a").Earlier.Fingerprint,
		"what is undone is not in the earlier fingerprint")
	require.Equal(t, &workflow.Compensation{Steps: []string{"b"}, NoReturnAfter: "a"},
		define("", []string{"a:A", "b:FC"}).Changes(workflow.Removed("c")).PointOfNoReturn("a").Spec().Compensation,
		"declared after the spec was first computed")
	require.Equal(t, base.Fingerprint[:12], base.Version, "no explicit version: a short fingerprint")
	require.Equal(t, base.Fingerprint, spec(t, "", []string{"a:A", "b:F"}).Fingerprint)
	require.Equal(t, base.Fingerprint, spec(t, "", []string{"a:A", "b:F"}, workflow.Removed("c")).Fingerprint,
		"declared changes are not the steps")
	for _, other := range []workflow.Spec{
		spec(t, "", []string{"a:A", "b:A"}),
		spec(t, "", []string{"b:F", "a:A"}),
		spec(t, "", []string{"a:A", "bb:F"}),
		spec(t, "", []string{"a:A", "b:F", "c:A"}),
		spec(t, "v2", []string{"a:A", "b:F"}),
		spec(t, "", []string{"a:A", "b:FC"}),
		specNoReturn(t, "", []string{"a:A", "b:F"}, "a"),
		specNoReturn(t, "", []string{"a:A", "b:F"}, "b"),
	} {
		require.NotEqual(t, base.Fingerprint, other.Fingerprint, "%+v", other)
	}
}

// TestResumableComparesWhatIsUndone: a record another definition wrote is
// resumed only if the new one undoes what it may have done as the old one
// would: a record past the old point of no return must stay past the new
// one, a record before it must not be past the new one, and each step it
// may have done must keep or lack its compensation as it did. Changes after
// what it may have done are the new definition's to make.
func TestResumableComparesWhatIsUndone(t *testing.T) {
	steps := []string{"create_order:A", "charge:FC", "record_charge:A", "ship:F", "mark_shipped:A"}
	undoChargeUntilShipped := specNoReturn(t, "v1", steps, "mark_shipped")
	neverUndoCharged := specNoReturn(t, "v1", steps, "record_charge")
	for _, tc := range []struct {
		name     string
		old, cur workflow.Spec
		point    string
		parks    bool
	}{
		{name: "point of no return moved after a record past it", point: "record_charge", parks: true,
			old: neverUndoCharged, cur: specNoReturn(t, "v2", steps, "mark_shipped")},
		{name: "point of no return dropped after a record past it", point: "mark_shipped", parks: true,
			old: neverUndoCharged, cur: spec(t, "v2", steps)},
		{name: "point of no return moved before a record that was not past it", point: "record_charge", parks: true,
			old: undoChargeUntilShipped, cur: specNoReturn(t, "v2", steps, "create_order")},
		{name: "point of no return moved, the record past both", point: "mark_shipped",
			old: undoChargeUntilShipped, cur: specNoReturn(t, "v2", steps, "record_charge")},
		{name: "point of no return moved, the record before both", point: "create_order",
			old: undoChargeUntilShipped, cur: specNoReturn(t, "v2", steps, "record_charge")},
		{name: "compensation dropped from a step the record did", point: "record_charge", parks: true,
			old: undoChargeUntilShipped, cur: specNoReturn(t, "v2", []string{"create_order:A", "charge:F", "record_charge:A", "ship:F", "mark_shipped:A"}, "mark_shipped")},
		{name: "compensation dropped from a step that may have started", point: "create_order", parks: true,
			old: undoChargeUntilShipped, cur: specNoReturn(t, "v2", []string{"create_order:A", "charge:F", "record_charge:A", "ship:F", "mark_shipped:A"}, "mark_shipped")},
		{name: "compensation added to a step the record did", point: "record_charge", parks: true,
			old: specNoReturn(t, "v1", []string{"create_order:A", "charge:F", "record_charge:A", "ship:F", "mark_shipped:A"}, "mark_shipped"),
			cur: undoChargeUntilShipped},
		{name: "compensation added to a step after what the record did", point: "create_order",
			old: undoChargeUntilShipped, cur: specNoReturn(t, "v2", []string{"create_order:A", "charge:FC", "record_charge:A", "ship:FC", "mark_shipped:A"}, "mark_shipped")},
		{name: "point of no return moved past a record, nothing it did undoable", point: "record_charge",
			old: specNoReturn(t, "v1", []string{"create_order:A", "charge:F", "record_charge:A", "audit:A", "ship:FC"}, "record_charge"),
			cur: spec(t, "v2", []string{"create_order:A", "charge:F", "record_charge:A", "audit:A", "ship:FC"})},
		{name: "point of no return moved past a record whose next call, undoable, may have started", point: "record_charge", parks: true,
			old: specNoReturn(t, "v1", []string{"create_order:A", "charge:F", "record_charge:A", "ship:FC"}, "record_charge"),
			cur: spec(t, "v2", []string{"create_order:A", "charge:F", "record_charge:A", "ship:FC"})},
		{name: "compensation dropped from a first foreign step, nothing committed", point: "", parks: true,
			old: spec(t, "v1", []string{"charge:FC", "record_charge:A"}), cur: spec(t, "v2", []string{"charge:F", "record_charge:A"})},
		{name: "compensation dropped from a step the record did, past both points of no return", point: "record_charge",
			old: neverUndoCharged, cur: specNoReturn(t, "v2", []string{"create_order:A", "charge:F", "record_charge:A", "ship:F", "mark_shipped:A"}, "create_order")},
	} {
		_, why := workflow.Resumable(tc.old, tc.point, tc.cur)
		if tc.parks {
			require.NotEmpty(t, why, tc.name)
		} else {
			require.Empty(t, why, tc.name)
		}
	}
}

// TestDiff: the deploy check lists the recovery points that would park,
// and nothing for a definition kept with Versions.
func TestDiff(t *testing.T) {
	v1 := spec(t, "v1", []string{"create_order:A", "charge:F", "record_charge:A"})
	after := spec(t, "v2", []string{"create_order:A", "charge:F", "record_charge:A", "send_receipt:F"})
	require.Empty(t, workflow.Diff([]workflow.Spec{v1}, []workflow.Spec{after}))

	before := spec(t, "v2", []string{"create_order:A", "fraud_check:F", "charge:F", "record_charge:A"})
	findings := workflow.Diff([]workflow.Spec{v1}, []workflow.Spec{before})
	require.Len(t, findings, 2, "%v", findings) // after create_order (charge may have started) and after charge
	require.Equal(t, "create_order", findings[0].RecoveryPoint)
	require.Equal(t, "charge", findings[1].RecoveryPoint)
	require.Equal(t, "v1", findings[0].From)
	require.Equal(t, "v2", findings[0].To)

	require.Empty(t, workflow.Diff([]workflow.Spec{v1}, []workflow.Spec{v1, before}), "v1 kept registered")
	gone := workflow.Diff([]workflow.Spec{v1}, nil)
	require.Len(t, gone, 3)

	refunded := specNoReturn(t, "v1", []string{"create_order:A", "charge:FC", "record_charge:A", "ship:F"}, "record_charge")
	confirmed := specNoReturn(t, "v1", []string{"create_order:A", "charge:FC", "record_charge:A", "confirm:A", "ship:F"}, "record_charge")
	later := specNoReturn(t, "v2", []string{"create_order:A", "charge:FC", "record_charge:A", "confirm:A", "ship:F"}, "confirm")
	findings = workflow.Diff([]workflow.Spec{confirmed}, []workflow.Spec{later})
	require.Len(t, findings, 1, "%v", findings) // a record after record_charge: v2 would refund what v1 never would
	require.Equal(t, "record_charge", findings[0].RecoveryPoint)
	require.Contains(t, findings[0].Reason, "point of no return")
	unrefunded := specNoReturn(t, "v2", []string{"create_order:A", "charge:F", "record_charge:A", "ship:F"}, "record_charge")
	findings = workflow.Diff([]workflow.Spec{refunded}, []workflow.Spec{unrefunded})
	require.Len(t, findings, 2, "%v", findings) // charge may have started, or is done, and v2 cannot refund it
	require.Contains(t, findings[0].Reason, "compensation")
	require.Equal(t, "charge", findings[1].RecoveryPoint)

	// An export from a build that did not record what is undone: its
	// definition is the current one of the same earlier fingerprint, and a
	// change of what is undone cannot be seen.
	legacy := confirmed
	legacy.Fingerprint, legacy.State, legacy.Earlier, legacy.Compensation = confirmed.Earlier.Fingerprint, confirmed.Earlier.State, nil, nil
	require.Empty(t, workflow.Diff([]workflow.Spec{legacy}, []workflow.Spec{confirmed}), "the same definition")
	require.Empty(t, workflow.Diff([]workflow.Spec{legacy}, []workflow.Spec{later}), "what v1 undid is unknown")
	require.Len(t, workflow.Diff([]workflow.Spec{legacy}, []workflow.Spec{before}), 4, "the steps are compared")
}

// TestStateShapeIsPartOfTheDefinition: a state type whose JSON shape
// changed (a field renamed, retyped or removed) makes another definition;
// one whose Go field names changed but JSON did not, the same.
func TestStateShapeIsPartOfTheDefinition(t *testing.T) {
	type v1 struct {
		OrderID  int64  `json:"order_id"`
		ChargeID string `json:"charge_id"`
	}
	type sameJSON struct {
		Order  int64  `json:"order_id"`
		Charge string `json:"charge_id"`
	}
	type renamed struct {
		OrderID   int64  `json:"order_id"`
		PaymentID string `json:"payment_id"`
	}
	type retyped struct {
		OrderID  string `json:"order_id"`
		ChargeID string `json:"charge_id"`
	}
	type embedded struct {
		sameJSON
	}
	step := func(name string) phase.Step[Order, v1] {
		return phase.Atomic(name, func(context.Context, pgx.Tx, *phase.Run[Order, v1]) error { return nil })
	}
	shapeOf := func(def interface{ Spec() workflow.Spec }) workflow.Spec { return def.Spec() }
	base := shapeOf(workflow.Define("s", step("a")))
	require.NotEmpty(t, base.State)
	noop := func(context.Context, pgx.Tx, *phase.Run[Order, sameJSON]) error { return nil }
	require.Equal(t, base.State, shapeOf(workflow.Define("s", phase.Atomic("a", noop))).State)
	require.Equal(t, base.State, shapeOf(workflow.Define("s", phase.Atomic("a",
		func(context.Context, pgx.Tx, *phase.Run[Order, embedded]) error { return nil }))).State)
	for _, other := range []workflow.Spec{
		shapeOf(workflow.Define("s", phase.Atomic("a", func(context.Context, pgx.Tx, *phase.Run[Order, renamed]) error { return nil }))),
		shapeOf(workflow.Define("s", phase.Atomic("a", func(context.Context, pgx.Tx, *phase.Run[Order, retyped]) error { return nil }))),
	} {
		require.NotEqual(t, base.State, other.State)
		require.NotEqual(t, base.Fingerprint, other.Fingerprint)
	}
}
