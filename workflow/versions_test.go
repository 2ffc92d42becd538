package workflow_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// spec builds a definition of steps written as "name:A" (atomic) or
// "name:F" (foreign), with changes.
func spec(t *testing.T, version string, steps []string, changes ...workflow.Change) workflow.Spec {
	t.Helper()
	var ps []phase.Step[Order, Paid]
	for _, s := range steps {
		name, kind := s[:len(s)-2], s[len(s)-1]
		if kind == 'A' {
			ps = append(ps, phase.Atomic(name, func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil }))
		} else {
			ps = append(ps, phase.Foreign(name, func(context.Context, *phase.Run[Order, Paid]) error { return nil }))
		}
	}
	return workflow.Define("checkout", ps...).Version(version).Changes(changes...).Spec()
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
	} {
		require.NotEqual(t, base.Fingerprint, other.Fingerprint, "%+v", other.Steps)
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
