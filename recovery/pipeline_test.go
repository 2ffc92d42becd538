package recovery_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/recovery"
)

func acquire(t *testing.T, b *bundle) *pgxpool.Conn {
	t.Helper()
	conn, err := b.db.Acquire(b.ctx)
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	return conn
}

// TestPipelinedClaimAndCommit: the claim opens the transaction, the
// recovery point commits with it, each in one round trip.
func TestPipelinedClaimAndCommit(t *testing.T) {
	b := setup(t)
	_, err := b.db.Exec(b.ctx, `CREATE TABLE effects (note text)`)
	require.NoError(t, err)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	conn := acquire(t, b)

	rec, outcome, err := seam.StoreOf(b.store).BeginAndClaim(b.ctx, conn, []string{"begin"}, params(t, key, `{}`))
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeNew, outcome)
	require.Equal(t, byte('T'), conn.Conn().PgConn().TxStatus(), "the claim's transaction is open")
	_, err = conn.Exec(b.ctx, `INSERT INTO effects VALUES ('first phase')`)
	require.NoError(t, err)
	require.NoError(t, seam.StoreOf(b.store).AdvanceAndCommit(b.ctx, conn, rec.Fence(), "first", []byte(`{"n":1}`)))
	require.Equal(t, byte('I'), conn.Conn().PgConn().TxStatus(), "committed")
	require.Equal(t, "first", b.load(t, key).RecoveryPoint)

	_, err = conn.Exec(b.ctx, `BEGIN`)
	require.NoError(t, err)
	_, err = conn.Exec(b.ctx, `INSERT INTO effects VALUES ('last phase')`)
	require.NoError(t, err)
	require.NoError(t, seam.StoreOf(b.store).CompleteAndCommit(b.ctx, conn, rec.Fence(), "last", []byte(`{"n":2}`), jsonResponse))
	got := b.load(t, key)
	require.Equal(t, recovery.StatusCompleted, got.Status)
	require.Equal(t, jsonResponse.Body, got.Response.Body)

	// A replay through the pipelined claim leaves a read-only transaction.
	rec, outcome, err = seam.StoreOf(b.store).BeginAndClaim(b.ctx, conn, []string{"begin"}, params(t, key, `{}`))
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeReplay, outcome)
	require.Equal(t, jsonResponse.Body, rec.Response.Body)
	_, err = conn.Exec(b.ctx, `ROLLBACK`)
	require.NoError(t, err)
	var n int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM effects`).Scan(&n))
	require.Equal(t, 2, n)
}

// TestPipelinedCommitIsFenced: when the fence fails, the COMMIT sent with
// the fenced write does not commit the attempt's writes.
func TestPipelinedCommitIsFenced(t *testing.T) {
	b := setup(t)
	_, err := b.db.Exec(b.ctx, `CREATE TABLE effects (note text)`)
	require.NoError(t, err)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{}`)
	stale, _ := b.claim(t, p)
	b.expire(t, key)
	b.claim(t, p) // taken over

	for _, commit := range map[string]func(conn *pgxpool.Conn) error{
		"advance": func(conn *pgxpool.Conn) error {
			return seam.StoreOf(b.store).AdvanceAndCommit(b.ctx, conn, stale.Fence(), "step", nil)
		},
		"complete": func(conn *pgxpool.Conn) error {
			return seam.StoreOf(b.store).CompleteAndCommit(b.ctx, conn, stale.Fence(), "step", nil, jsonResponse)
		},
	} {
		conn := acquire(t, b)
		_, err := conn.Exec(b.ctx, `BEGIN`)
		require.NoError(t, err)
		_, err = conn.Exec(b.ctx, `INSERT INTO effects VALUES ('stale')`)
		require.NoError(t, err)
		require.ErrorIs(t, commit(conn), recovery.ErrLeaseLost)
		require.Equal(t, byte('E'), conn.Conn().PgConn().TxStatus(), "the transaction is aborted, not committed")
		_, err = conn.Exec(b.ctx, `ROLLBACK`)
		require.NoError(t, err)
	}
	var n int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM effects`).Scan(&n))
	require.Zero(t, n, "the stale attempt's writes never committed")
}

// TestPipelinedClaimRacingAFirstClaim: a pipelined claim of a key whose
// first claim is uncommitted (its first phase runs) is told the key is in
// flight at once, on a connection it can roll back and reuse.
func TestPipelinedClaimRacingAFirstClaim(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{}`)
	first := acquire(t, b)
	_, _, err := seam.StoreOf(b.store).BeginAndClaim(b.ctx, first, []string{"begin"}, p)
	require.NoError(t, err)

	// The second claim does not wait for the first's transaction (migration
	// 0006): it is told at once that the key is in flight.
	second := acquire(t, b)
	_, _, err = seam.StoreOf(b.store).BeginAndClaim(b.ctx, second, []string{"begin"}, p)
	var inFlight *recovery.InFlightError
	require.ErrorAs(t, err, &inFlight)
	_, err = first.Exec(b.ctx, `COMMIT`)
	require.NoError(t, err)
	_, err = second.Exec(context.Background(), `ROLLBACK`)
	require.NoError(t, err)
}
