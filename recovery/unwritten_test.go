package recovery_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/recovery"
)

// beginAndClaim opens a transaction on a connection of its own with the
// claim of p in it, as the engine does for a workflow whose first step is
// an atomic phase.
func (b *bundle) beginAndClaim(t *testing.T, p recovery.ClaimParams) (seam.Conn, *recovery.Record, recovery.Outcome) {
	t.Helper()
	conn := acquire(t, b)
	rec, outcome, err := seam.StoreOf(b.store).BeginAndClaim(b.ctx, conn, []string{"begin"}, "", p)
	require.NoError(t, err)
	return conn, rec, outcome
}

// TestClaimInAPhaseInsertsWithItsOutcome: a claim that opens the first
// phase's transaction inserts nothing (migration 0019); the phase's
// recovery point inserts the record, with the claim's id, owner and
// request, and a history of the claim and the phase. Only one version of
// the row is ever written in that transaction.
func TestClaimInAPhaseInsertsWithItsOutcome(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{"amount": 100}`)
	p.Definition, p.Principal, p.TraceParent = "def-1", "user-7", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	conn, rec, outcome := b.beginAndClaim(t, p)
	require.Equal(t, recovery.OutcomeNew, outcome)
	require.Zero(t, b.count(t), "nothing inserted yet, not even uncommitted: no row for another session to wait on")
	var inTx int
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT count(*) FROM onceflow_keys`).Scan(&inTx))
	require.Zero(t, inTx, "not even in the claim's own transaction")

	require.NoError(t, seam.StoreOf(b.store).AdvanceAndCommit(b.ctx, conn, "", rec.Fence(), "create_order", []byte(`{"order":1}`)))
	got := b.load(t, key)
	require.Equal(t, rec.ID, got.ID)
	require.Equal(t, rec.Owner, got.Owner)
	require.Equal(t, p.Fingerprint, got.Fingerprint)
	require.JSONEq(t, string(p.Request), string(got.Request))
	require.Equal(t, "def-1", got.Definition)
	require.Equal(t, p.TraceParent, got.TraceParent)
	require.Equal(t, recovery.StatusInFlight, got.Status)
	require.Equal(t, "create_order", got.RecoveryPoint)
	require.JSONEq(t, `{"order":1}`, string(got.State))
	require.Zero(t, got.Attempts)
	require.True(t, got.LockedUntil.After(got.UpdatedAt), "leased")
	require.Equal(t, []recovery.TransitionKind{recovery.TransitionClaimed, recovery.TransitionPhaseCommitted}, kinds(got.History))
	require.Equal(t, rec.Owner, got.History[0].Owner)
	require.Equal(t, "create_order", got.History[1].Step)
	require.False(t, got.History[0].At.Before(got.CreatedAt), "stamped by the claim")
	require.Equal(t, rec.CreatedAt, got.CreatedAt, "created when claimed")

	// The principal was stored: another one is refused.
	other := p
	other.Principal = "user-8"
	_, _, err := b.store.Claim(b.ctx, other)
	require.ErrorIs(t, err, recovery.ErrForbidden)

	// The fence now updates the inserted record.
	_, err = conn.Exec(b.ctx, `BEGIN`)
	require.NoError(t, err)
	require.NoError(t, seam.StoreOf(b.store).CompleteAndCommit(b.ctx, conn, "", rec.Fence(), "record_charge", nil, jsonResponse))
	got = b.load(t, key)
	require.Equal(t, recovery.StatusCompleted, got.Status)
	require.Equal(t, []recovery.TransitionKind{recovery.TransitionClaimed, recovery.TransitionPhaseCommitted,
		recovery.TransitionCompleted}, kinds(got.History))
}

// TestClaimInAPhaseFinishesInOneInsert: a first phase that is also the
// last, or that fails the record for good, inserts it finished.
func TestClaimInAPhaseFinishesInOneInsert(t *testing.T) {
	b := setup(t)
	for _, c := range []struct {
		name   string
		finish func(conn seam.Conn, rec *recovery.Record) error
		status recovery.Status
		kind   recovery.TransitionKind
	}{
		{"completed", func(conn seam.Conn, rec *recovery.Record) error {
			return seam.StoreOf(b.store).CompleteAndCommit(b.ctx, conn, "", rec.Fence(), "only", []byte(`{}`), jsonResponse)
		}, recovery.StatusCompleted, recovery.TransitionCompleted},
		{"failed", func(conn seam.Conn, rec *recovery.Record) error {
			if err := seam.StoreOf(b.store).WithConn(conn).Fail(b.ctx, rec.Fence(), jsonResponse, "aborted"); err != nil {
				return err
			}
			_, err := conn.Exec(b.ctx, `COMMIT`)
			return err
		}, recovery.StatusFailed, recovery.TransitionFailed},
	} {
		key := recovery.Key{Tenant: "acme", ID: c.name}
		p := params(t, key, `{}`)
		conn, rec, _ := b.beginAndClaim(t, p)
		require.NoError(t, c.finish(conn, rec), c.name)
		got := b.load(t, key)
		require.Equal(t, c.status, got.Status, c.name)
		require.Equal(t, jsonResponse.Body, got.Response.Body, c.name)
		require.True(t, got.LockedUntil.IsZero() && !got.CompletedAt.IsZero(), c.name)
		require.Equal(t, []recovery.TransitionKind{recovery.TransitionClaimed, c.kind}, kinds(got.History), c.name)
		replay, outcome := b.claim(t, p)
		require.Equal(t, recovery.OutcomeReplay, outcome, c.name)
		require.Equal(t, jsonResponse.Body, replay.Response.Body, c.name)
	}
}

// TestClaimInAPhaseLeavesNothingWithoutAWrite: a transaction that ends
// without a fenced write, committed or rolled back, leaves no record: the
// key is free again.
func TestClaimInAPhaseLeavesNothingWithoutAWrite(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	for _, end := range []string{"COMMIT", "ROLLBACK"} {
		conn, _, outcome := b.beginAndClaim(t, params(t, key, `{}`))
		require.Equal(t, recovery.OutcomeNew, outcome, end)
		_, err := conn.Exec(b.ctx, end)
		require.NoError(t, err)
		require.Zero(t, b.count(t), end)
	}
	_, outcome := b.claim(t, params(t, key, `{}`))
	require.Equal(t, recovery.OutcomeNew, outcome)
}

// TestClaimInAPhaseLosesToALocklessInsert: a build from before migration
// 0014 claims without the key lock, so it can insert and commit a record
// for the key while this build's first phase runs. The phase's insert then
// fails on the primary key: the lease is lost and the transaction, with
// what the phase wrote, rolls back.
func TestClaimInAPhaseLosesToALocklessInsert(t *testing.T) {
	b := setup(t)
	_, err := b.db.Exec(b.ctx, `CREATE TABLE effects (note text)`)
	require.NoError(t, err)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{}`)
	conn, rec, _ := b.beginAndClaim(t, p)
	_, err = conn.Exec(b.ctx, `INSERT INTO effects VALUES ('first phase')`)
	require.NoError(t, err)

	old := uuid.New()
	_, err = b.db.Exec(b.ctx, `INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, owner, locked_until)
		VALUES ($1, $2, gen_random_uuid(), 'checkout', $3, $4, clock_timestamp() + interval '1 minute')`,
		key.Tenant, key.ID, p.Fingerprint[:], old)
	require.NoError(t, err)

	err = seam.StoreOf(b.store).AdvanceAndCommit(b.ctx, conn, "", rec.Fence(), "create_order", nil)
	require.ErrorIs(t, err, recovery.ErrLeaseLost)
	_, err = conn.Exec(b.ctx, `ROLLBACK`)
	require.NoError(t, err)
	require.Equal(t, old, b.load(t, key).Owner, "the other build's record stands")
	var n int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM effects`).Scan(&n))
	require.Zero(t, n, "the first phase's writes rolled back")
}
