package recovery_test

import (
	"context"
	"strconv"
	"testing"
	"time"

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

	rec, outcome, err := seam.StoreOf(b.store).BeginAndClaim(b.ctx, conn, []string{"begin"}, "", params(t, key, `{}`))
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeNew, outcome)
	require.Equal(t, byte('T'), conn.Conn().PgConn().TxStatus(), "the claim's transaction is open")
	_, err = conn.Exec(b.ctx, `INSERT INTO effects VALUES ('first phase')`)
	require.NoError(t, err)
	require.NoError(t, seam.StoreOf(b.store).AdvanceAndCommit(b.ctx, conn, "", rec.Fence(), "first", []byte(`{"n":1}`)))
	require.Equal(t, byte('I'), conn.Conn().PgConn().TxStatus(), "committed")
	require.Equal(t, "first", b.load(t, key).RecoveryPoint)

	_, err = conn.Exec(b.ctx, `BEGIN`)
	require.NoError(t, err)
	_, err = conn.Exec(b.ctx, `INSERT INTO effects VALUES ('last phase')`)
	require.NoError(t, err)
	require.NoError(t, seam.StoreOf(b.store).CompleteAndCommit(b.ctx, conn, "", rec.Fence(), "last", []byte(`{"n":2}`), jsonResponse))
	got := b.load(t, key)
	require.Equal(t, recovery.StatusCompleted, got.Status)
	require.Equal(t, jsonResponse.Body, got.Response.Body)

	// A replay through the pipelined claim leaves a read-only transaction.
	rec, outcome, err = seam.StoreOf(b.store).BeginAndClaim(b.ctx, conn, []string{"begin"}, "", params(t, key, `{}`))
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
			return seam.StoreOf(b.store).AdvanceAndCommit(b.ctx, conn, "", stale.Fence(), "step", nil)
		},
		"complete": func(conn *pgxpool.Conn) error {
			return seam.StoreOf(b.store).CompleteAndCommit(b.ctx, conn, "", stale.Fence(), "step", nil, jsonResponse)
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
	_, _, err := seam.StoreOf(b.store).BeginAndClaim(b.ctx, first, []string{"begin"}, "", p)
	require.NoError(t, err)

	// The second claim does not wait for the first's transaction (migration
	// 0006): it is told at once that the key is in flight.
	second := acquire(t, b)
	_, _, err = seam.StoreOf(b.store).BeginAndClaim(b.ctx, second, []string{"begin"}, "", p)
	var inFlight *recovery.InFlightError
	require.ErrorAs(t, err, &inFlight)
	_, err = first.Exec(b.ctx, `COMMIT`)
	require.NoError(t, err)
	_, err = second.Exec(context.Background(), `ROLLBACK`)
	require.NoError(t, err)
}

// TestPipelinedClaimBoundsItsTransaction: a claim or a takeover that takes
// a key in the transaction it opens sets idle_in_transaction_session_timeout
// to the lease for that transaction alone, so that a process cut off from
// the server cannot hold the key for longer; a replay sets nothing, and a
// timeout the session set already is left as it is.
func TestPipelinedClaimBoundsItsTransaction(t *testing.T) {
	b := setup(t)
	conn := acquire(t, b)
	idle := func() string {
		t.Helper()
		var ms string
		require.NoError(t, conn.QueryRow(b.ctx,
			`SELECT setting FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'`).Scan(&ms))
		return ms
	}
	claim := func(id string) recovery.Outcome {
		t.Helper()
		_, outcome, err := seam.StoreOf(b.store).BeginAndClaim(b.ctx, conn, []string{"begin"}, "", params(t, recovery.Key{Tenant: "acme", ID: id}, `{}`))
		require.NoError(t, err)
		return outcome
	}
	rollback := func() {
		t.Helper()
		_, err := conn.Exec(b.ctx, `ROLLBACK`)
		require.NoError(t, err)
	}
	bound := strconv.FormatInt(recovery.IdleTimeoutDefault.Milliseconds(), 10) // the default IdleTimeout

	require.Equal(t, "0", idle(), "the test server sets no timeout")
	require.Equal(t, recovery.OutcomeNew, claim("k1"))
	require.Equal(t, bound, idle(), "a new key's transaction is bounded by IdleTimeout")
	rollback()
	require.Equal(t, "0", idle(), "for that transaction alone")

	b.claim(t, params(t, recovery.Key{Tenant: "acme", ID: "k2"}, `{}`))
	b.expire(t, recovery.Key{Tenant: "acme", ID: "k2"})
	require.Equal(t, recovery.OutcomeTakeover, claim("k2"))
	require.Equal(t, bound, idle(), "a takeover's transaction too")
	rollback()

	done, _ := b.claim(t, params(t, recovery.Key{Tenant: "acme", ID: "k3"}, `{}`))
	require.NoError(t, b.store.Complete(b.ctx, done.Fence(), jsonResponse))
	require.Equal(t, recovery.OutcomeReplay, claim("k3"))
	require.Equal(t, "0", idle(), "a replay holds nothing and sets nothing")
	rollback()

	// A resume's takeover made in the transaction of the phase it resumes
	// (Engine.Resume, the sweeper's completer).
	k5 := recovery.Key{Tenant: "acme", ID: "k5"}
	b.claim(t, params(t, k5, `{}`))
	b.expire(t, k5)
	tx, err := conn.Begin(b.ctx)
	require.NoError(t, err)
	_, outcome, err := seam.StoreOf(b.store.WithTx(tx)).Takeover(b.ctx, k5, "checkout")
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeTakeover, outcome)
	require.Equal(t, bound, idle(), "a resume's takeover in a transaction bounds it")
	require.NoError(t, tx.Rollback(b.ctx))
	tx, err = conn.Begin(b.ctx)
	require.NoError(t, err)
	_, outcome, err = seam.StoreOf(b.store.WithTx(tx)).Takeover(b.ctx, recovery.Key{Tenant: "acme", ID: "k3"}, "checkout")
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeReplay, outcome)
	require.Equal(t, "0", idle(), "a takeover that found the record finished sets nothing")
	require.NoError(t, tx.Rollback(b.ctx))

	// A claim on the caller's own transaction (Store.WithTx) takes the key
	// in it, uncommitted, as the pipelined claim does.
	tx, err = conn.Begin(b.ctx)
	require.NoError(t, err)
	_, outcome, err = b.store.WithTx(tx).Claim(b.ctx, params(t, recovery.Key{Tenant: "acme", ID: "k6"}, `{}`))
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeNew, outcome)
	require.Equal(t, bound, idle(), "a claim in the caller's transaction bounds it")
	require.NoError(t, tx.Rollback(b.ctx))

	// A Store with a negative IdleTimeout sets nothing; one with its own
	// sets that, rounded up to whole milliseconds (long enough that a
	// loaded machine's pause before the next statement does not reach it).
	for _, c := range []struct {
		idle time.Duration
		want string
	}{{-1, "0"}, {90*time.Second + time.Microsecond, "90001"}} {
		store, err := recovery.New(b.db, recovery.Config{IdleTimeout: c.idle})
		require.NoError(t, err)
		_, outcome, err := seam.StoreOf(store).BeginAndClaim(b.ctx, conn, []string{"begin"}, "",
			params(t, recovery.Key{Tenant: "acme", ID: "k7" + c.idle.String()}, `{}`))
		require.NoError(t, err)
		require.Equal(t, recovery.OutcomeNew, outcome)
		require.Equal(t, c.want, idle(), "IdleTimeout %s", c.idle)
		rollback()
	}

	_, err = conn.Exec(b.ctx, `SET idle_in_transaction_session_timeout = 7000`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), `RESET idle_in_transaction_session_timeout`) })
	require.Equal(t, recovery.OutcomeNew, claim("k4"))
	require.Equal(t, "7000", idle(), "the session's own timeout stands")
	rollback()
}

// TestIdleTimeoutOutOfRange: an IdleTimeout PostgreSQL cannot take is
// refused when the Store is made, not at the first claim.
func TestIdleTimeoutOutOfRange(t *testing.T) {
	for _, d := range []time.Duration{time.Microsecond, 25 * 24 * time.Hour} {
		_, err := recovery.New(nil, recovery.Config{IdleTimeout: d})
		var input *recovery.InputError
		require.ErrorAs(t, err, &input, "IdleTimeout %s", d)
	}
}
