package workflow_test

// A state's shape names each number's kind, and the upgrade to a release
// that does re-labels no record.

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// specOf is the spec of a one-step workflow "s" with state State.
func specOf[State any]() workflow.Spec {
	return workflow.Define("s", phase.Atomic("a", func(context.Context, pgx.Tx, *phase.Run[Order, State]) error { return nil })).Spec()
}

// TestStateShapeTellsNumbersApart: a state whose number changed kind reads
// other JSON (an int64 reads -1, a uint32 does not; a []byte is a base64
// string, a []uint16 an array), so it makes another definition; the
// earlier computation, which did not tell them apart, gave them one
// fingerprint, kept as Earlier.
func TestStateShapeTellsNumbersApart(t *testing.T) {
	t.Parallel()
	type i64 struct{ N int64 }
	type u32 struct{ N uint32 }
	type i32 struct{ N int32 }
	type f64 struct{ N float64 }
	type f32 struct{ N float32 }
	type quoted64 struct {
		N int64 `json:"N,string"`
	}
	type quotedU32 struct {
		N uint32 `json:"N,string"`
	}
	type bytes struct{ N []byte }
	type words struct{ N []uint16 }
	for _, pair := range [][2]workflow.Spec{
		{specOf[i64](), specOf[u32]()},
		{specOf[i64](), specOf[i32]()},
		{specOf[f64](), specOf[f32]()},
		{specOf[quoted64](), specOf[quotedU32]()},
		{specOf[bytes](), specOf[words]()},
	} {
		a, b := pair[0], pair[1]
		require.NotEqual(t, a.State, b.State)
		require.NotEqual(t, a.Fingerprint, b.Fingerprint)
		require.NotNil(t, a.Earlier)
		require.NotNil(t, b.Earlier)
		require.Equal(t, a.Earlier.Fingerprint, b.Earlier.Fingerprint, "one definition to the earlier computation")
	}
	type text struct{ N string }
	require.Equal(t, specOf[text]().State, specOf[text]().Earlier.State, "a state without numbers kept its shape")
}

// goldenState holds every kind of value the shape describes.
type goldenState struct {
	A int64 `json:"a"`
	B []byte
	C map[string]float32
	D *uint16 `json:"d,string"`
	E []struct {
		X uint
		Y json.RawMessage
	}
	F time.Time
	G any
	H [4]uint8
	I bool
}

// TestEarlierFingerprintsAreTheOnesEarlierReleasesStamped: the fingerprints
// and state shapes releases before Spec.Earlier computed, for the test
// checkout and for a state of every kind, as they stamped records: a
// record they left in flight is known as its definition's.
func TestEarlierFingerprintsAreTheOnesEarlierReleasesStamped(t *testing.T) {
	t.Parallel()
	golden := workflow.Define("golden", phase.Atomic("a", func(context.Context, pgx.Tx, *phase.Run[Order, goldenState]) error { return nil })).Spec()
	require.Equal(t, &workflow.Earlier{Fingerprint: "d81fd815f462ebe678f37bbc880c9406", State: "eae7aca225b7d456"}, golden.Earlier)
	checkout := testapp.Checkout("http://provider.invalid", testapp.Options{}).Spec()
	require.Equal(t, &workflow.Earlier{Fingerprint: "499524329e8938a8ca06bd8d8163cc36", State: "1ff57216c2dd5550"}, checkout.Earlier)
	require.NotEqual(t, checkout.Earlier.Fingerprint, checkout.Fingerprint)
}

// TestUpgradeStateRunsWhenOnlyAnIntegersKindChanged: a release changed a
// state field from int64 to uint32 and reads the old states through an
// upgrader, which maps a negative balance to zero. Its records are another
// definition's, so the upgrader runs, and a record holding -1 completes.
func TestUpgradeStateRunsWhenOnlyAnIntegersKindChanged(t *testing.T) {
	w := newWorld(t)
	v1 := walletFlow(w, func(b *int64) { *b = -1 })
	w.crashIn(v1, func(e *workflow.Engine) error { _, err := v1.Run(w.ctx, e, acme, order); return err },
		workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "debit"}, acme)

	v2 := walletFlow(w, func(*uint32) {}).UpgradeState(func(old json.RawMessage) (wallet[uint32], error) {
		var s wallet[int64]
		err := json.Unmarshal(old, &s)
		return wallet[uint32]{ChargeID: s.ChargeID, Balance: uint32(max(s.Balance, 0))}, err
	})
	res, err := w.engine(workflow.Config{Workflows: []workflow.Definition{v2}}).Resume(w.ctx, acme)
	require.NoError(t, err)
	require.False(t, res.Failed)
	var s wallet[uint32]
	require.NoError(t, json.Unmarshal(w.record(acme).State, &s))
	require.Zero(t, s.Balance)
	require.NotEmpty(t, s.ChargeID, "the upgrader kept the charge")
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.Zero(t, w.provider.Effects("refunds"))
}

// TestARecordAnEarlierReleaseStampedStaysItsDefinitions: a release before
// Spec.Earlier ran version 1 (an int64 in its state) and registered
// version 2, which inserted a step before version 1's recovery point, with
// Versions(v1, v2). It stamped a record with version 1's fingerprint as it
// computed it, and stored that definition. After the upgrade of onceflow,
// version 1's fingerprint is another; the record must still be version
// 1's, and finish under it, not be compared with version 2 and parked.
func TestARecordAnEarlierReleaseStampedStaysItsDefinitions(t *testing.T) {
	w := newWorld(t)
	v1 := w.payFlow("1", "create_order:A", "charge:F@charges", "record_charge:A")
	v2 := w.payFlow("2", "create_order:A", "check:A", "charge:F@charges", "record_charge:A")
	both := workflow.Versions(v1, v2)
	w.crashIn(both, func(e *workflow.Engine) error { _, err := v1.Run(w.ctx, e, acme, order); return err },
		workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"}, acme)
	w.stampAsAnEarlierRelease(acme, v1.Spec())

	res, err := w.engine(workflow.Config{Workflows: []workflow.Definition{both}}).Resume(w.ctx, acme)
	require.NoError(t, err, "status %s: %s", w.record(acme).Status, w.record(acme).LastError)
	require.False(t, res.Failed)
	require.Equal(t, recovery.StatusCompleted, w.record(acme).Status)
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.Equal(t, v1.Spec().Fingerprint, w.record(acme).Definition, "the record is restamped with its definition's fingerprint of this release")
	require.Empty(t, workflow.Diff([]workflow.Spec{earlierSpec(v1.Spec())}, []workflow.Spec{v1.Spec(), v2.Spec()}),
		"the deploy check knows the definition too")
}

// earlierSpec is sp as a release before Spec.Earlier stored it.
func earlierSpec(sp workflow.Spec) workflow.Spec {
	sp.Fingerprint, sp.State, sp.Earlier = sp.Earlier.Fingerprint, sp.Earlier.State, nil
	return sp
}

// stampAsAnEarlierRelease makes key's record as a release before
// Spec.Earlier would have left it: stamped with sp's earlier fingerprint,
// which is stored with the definition it computed.
func (w *world) stampAsAnEarlierRelease(key workflow.Key, sp workflow.Spec) {
	w.t.Helper()
	old := earlierSpec(sp)
	body, err := json.Marshal(old)
	require.NoError(w.t, err)
	_, err = w.db.Exec(w.ctx, `INSERT INTO onceflow_definitions (workflow, fingerprint, version, spec) VALUES ($1, $2, $3, $4)`,
		old.Workflow, old.Fingerprint, old.Version, body)
	require.NoError(w.t, err)
	_, err = w.db.Exec(w.ctx, `UPDATE onceflow_keys SET definition = $3 WHERE tenant_id = $1 AND key = $2`, key.Tenant, key.ID, old.Fingerprint)
	require.NoError(w.t, err)
}

// TestAnEarlierReleasesStateShapeIsComparedAsItComputedIt: version 2
// declared an upgrader (a change of its state's shape) and version 3
// dropped it, keeping the shape. A release before Spec.Earlier stored
// version 2 with the shape as it computed it; version 3 resumes version
// 2's records, as that release would have, rather than taking the other
// computation for another shape and parking them.
func TestAnEarlierReleasesStateShapeIsComparedAsItComputedIt(t *testing.T) {
	t.Parallel()
	step := phase.Atomic("a", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil })
	v2 := workflow.Define("s", step).Version("2").UpgradeState(func(json.RawMessage) (Paid, error) { return Paid{}, nil }).Spec()
	v3 := workflow.Define("s", step).Version("3").Spec()
	point, why := workflow.Resumable(earlierSpec(v2), "a", v3)
	require.Empty(t, why)
	require.Equal(t, "a", point)
	_, why = workflow.Resumable(earlierSpec(v2), "a", specOf[goldenState]())
	require.Contains(t, why, "cannot read it", "another shape still parks")
}
