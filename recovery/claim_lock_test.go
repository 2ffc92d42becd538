package recovery_test

import (
	"crypto/sha256"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/recovery"
)

// TestFreshClaimWaitsOutALockNoDuplicateHolds: the INSERT of a brand-new key
// may wait briefly for a lock no duplicate holds: on a loaded server the
// extension lock of the table or an index (which a test cannot hold), or,
// as here, a table lock such as CREATE INDEX takes. The claim must wait it
// out and own the key, not answer "in flight" for a key nobody holds.
//
// Before migration 0017 the claim's 10 ms lock_timeout, meant for
// duplicates, ended that wait too, and the claim failed as in flight.
func TestFreshClaimWaitsOutALockNoDuplicateHolds(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "fresh"}
	holder, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(b.ctx) }()
	_, err = holder.Exec(b.ctx, `LOCK TABLE onceflow_keys IN SHARE MODE`)
	require.NoError(t, err)

	done := make(chan claimResult, 1)
	go func() {
		rec, outcome, err := b.store.Claim(b.ctx, params(t, key, `{"amount":100}`))
		done <- claimResult{rec, outcome, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		require.NoError(t, b.db.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE a.datname = current_database() AND l.locktype = 'relation' AND NOT l.granted)`).Scan(&waiting))
		if waiting {
			break
		}
		require.True(t, time.Now().Before(deadline), "the claim never waited for the table lock")
	}
	// Held well past the old 10 ms bound, well within the claim's 1 s one.
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, holder.Rollback(b.ctx))
	r := wait(t, done)
	require.NoError(t, r.err, "a key nobody holds is not in flight")
	require.Equal(t, recovery.OutcomeNew, r.outcome)
}

// TestDuplicateOfATakeoverDoesNotWait: while an attempt that took an expired
// lease over runs its next phase in the takeover's transaction (Resume and
// the completer fold it so), a claim of the key reads the expired lease
// from before the takeover. It is answered "in flight" at once, waiting on
// no lock, instead of waiting for the phase on the record's row.
func TestDuplicateOfATakeoverDoesNotWait(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "taken"}
	p := params(t, key, `{"amount":100}`)
	b.claim(t, p)
	b.expire(t, key)

	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, outcome, err := seam.StoreOf(b.store.WithTx(tx)).Takeover(b.ctx, key, "checkout")
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeTakeover, outcome)

	waits := dbtest.LockWaits(t, b.db, func() { _, _, err = b.store.Claim(b.ctx, p) })
	var inFlight *recovery.InFlightError
	require.ErrorAs(t, err, &inFlight)
	require.True(t, inFlight.Contended)
	require.Zero(t, waits, "the duplicate waited on a lock")
	require.NoError(t, tx.Commit(b.ctx))
}

// TestKeyLockIsDerivedFromSHA256: the key lock's number is the first 8
// bytes of a SHA-256 of the schema, the tenant and the key (migration
// 0018), so that no tenant can aim a key of its own at another tenant's
// lock, as it could with a hash not built to resist chosen collisions.
func TestKeyLockIsDerivedFromSHA256(t *testing.T) {
	b := setup(t)
	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = tx.Exec(b.ctx, `SELECT onceflow_lock_key('acme', 'order-123')`)
	require.NoError(t, err)

	sum := sha256.Sum256([]byte(`"public":4:acmeorder-123`)) // {schema} is the quoted schema
	n := binary.BigEndian.Uint64(sum[:8])
	var held int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1 AND granted`,
		int64(n>>32), int64(uint32(n))).Scan(&held))
	require.Equal(t, 1, held, "the lock on the key's SHA-256-derived number is held")
}

// TestDuplicateOfAClaimInATransactionDoesNotWait: a claim made on its own
// (Store.Claim, which inserts at once) inside a transaction of the
// caller's keeps its uncommitted row until that transaction ends. A
// duplicate is told "in flight" at once by the key lock, waiting on no
// lock, instead of waiting on that row for the rest of the transaction.
func TestDuplicateOfAClaimInATransactionDoesNotWait(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "held"}
	p := params(t, key, `{"amount":100}`)
	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, outcome, err := b.store.WithTx(tx).Claim(b.ctx, p)
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeNew, outcome)

	waits := dbtest.LockWaits(t, b.db, func() { _, _, err = b.store.Claim(b.ctx, p) })
	var inFlight *recovery.InFlightError
	require.ErrorAs(t, err, &inFlight)
	require.True(t, inFlight.Contended)
	require.Zero(t, waits, "the duplicate waited on a lock")
	require.NoError(t, tx.Commit(b.ctx))
}
