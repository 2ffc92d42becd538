package recovery_test

// Adversarial tests of migration 0009's claim (read, INSERT ... ON CONFLICT
// DO NOTHING, onceflow_take_over) and of the retries around it. Interleavings
// are forced, not hoped for: a gate in the test database stops one chosen
// claim between its read and its write until the test lets it go.

import (
	"context"

	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/recovery"
)

// gateLock is the advisory lock a gated claim waits on.
const gateLock = 4242

// gateSQL installs the gate: claim_gate_wait() blocks on gateLock once, in a
// backend listed in claim_gate, with the session's lock_timeout lifted for
// the wait alone. It runs in the claim's gap between its read and its
// write: first in onceflow_may_take_over (the rule is kept as it is, under
// another name), which the claim calls right after reading a record, and
// in onceflow_lock_key (likewise), which it calls before writing (migration
// 0017). After the key lock no other claim of the key can act until the
// claim's transaction ends, so that is where the gap ends.
const gateSQL = `
CREATE TABLE claim_gate (pid int PRIMARY KEY);
CREATE FUNCTION claim_gate_wait() RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE lt text;
BEGIN
    DELETE FROM claim_gate WHERE pid = pg_backend_pid();
    IF FOUND THEN
        lt := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', '0', true);
        PERFORM pg_advisory_lock(` + "4242" + `);
        PERFORM pg_advisory_unlock(` + "4242" + `);
        PERFORM set_config('lock_timeout', lt, true);
    END IF;
    RETURN true;
END $$;
ALTER FUNCTION onceflow_may_take_over(onceflow_keys, text, bytea, bytea, boolean) RENAME TO claim_gate_rule;
CREATE FUNCTION onceflow_may_take_over(k onceflow_keys, p_workflow text, p_hash bytea, p_principal bytea, p_undo boolean)
RETURNS boolean LANGUAGE sql VOLATILE AS $$
    SELECT claim_gate_wait() AND claim_gate_rule(k, p_workflow, p_hash, p_principal, p_undo)
$$;
ALTER FUNCTION onceflow_lock_key(text, text) RENAME TO claim_gate_lock_key;
CREATE FUNCTION onceflow_lock_key(p_tenant text, p_key text) RETURNS void LANGUAGE sql VOLATILE AS $$
    SELECT claim_gate_wait();
    SELECT claim_gate_lock_key(p_tenant, p_key)
$$;
`

// gated is a database with the gate, a store whose claims stop at it, and
// a store whose claims do not.
type gated struct {
	*bundle
	gatedStore *recovery.Store
	gatedPID   int32
	holder     *pgxpool.Conn // holds gateLock while closed
}

func setupGated(t *testing.T) *gated {
	t.Helper()
	t.Parallel()
	url := dbtest.DirectURL(t, dbtest.NewDatabase(t, dbtest.Options{}))
	b := setupWith(t, dbtest.Connect(t, url, 4))
	_, err := b.db.Exec(b.ctx, gateSQL)
	require.NoError(t, err)
	one := dbtest.Connect(t, url, 1)
	conn, err := one.Acquire(b.ctx)
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	g := &gated{bundle: b}
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&g.gatedPID))
	g.gatedStore, err = recovery.New(conn, recovery.Config{})
	require.NoError(t, err)
	g.holder, err = b.db.Acquire(b.ctx)
	require.NoError(t, err)
	t.Cleanup(g.holder.Release)
	return g
}

type claimResult struct {
	rec     *recovery.Record
	outcome recovery.Outcome
	err     error
}

// stopped starts a gated claim of p and returns once it waits at the gate,
// with a channel that delivers its result after release.
func (g *gated) stopped(t *testing.T, p recovery.ClaimParams) (<-chan claimResult, func()) {
	t.Helper()
	_, err := g.holder.Exec(g.ctx, `SELECT pg_advisory_lock($1)`, gateLock)
	require.NoError(t, err)
	_, err = g.db.Exec(g.ctx, `INSERT INTO claim_gate VALUES ($1)`, g.gatedPID)
	require.NoError(t, err)
	done := make(chan claimResult, 1)
	go func() {
		rec, outcome, err := g.gatedStore.Claim(context.Background(), p)
		done <- claimResult{rec, outcome, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		require.NoError(t, g.db.QueryRow(g.ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted AND pid = $1)`, g.gatedPID).Scan(&waiting))
		if waiting {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the gated claim ended before the gate: %v %v", r.outcome, r.err)
		default:
		}
		require.True(t, time.Now().Before(deadline), "the gated claim never reached the gate")
		time.Sleep(time.Millisecond)
	}
	release := func() {
		_, err := g.holder.Exec(g.ctx, `SELECT pg_advisory_unlock($1)`, gateLock)
		require.NoError(t, err)
	}
	return done, release
}

func wait(t *testing.T, done <-chan claimResult) claimResult {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the gated claim did not finish")
		return claimResult{}
	}
}

// TestClaimRaceInsertConflictsWithExpiredRow: a first claim reads no row; before
// its INSERT checks for a conflict, another claim of the same request
// commits a row whose lease has already ended. The INSERT does nothing and
// onceflow_take_over must take the row over, once, counting the abandoned
// attempt; a claim by another principal or with another request must not.
func TestClaimRaceInsertConflictsWithExpiredRow(t *testing.T) {
	g := setupGated(t)
	key := recovery.Key{Tenant: "acme", ID: "late-insert"}
	p := params(t, key, `{"amount":100}`)

	done, release := g.stopped(t, p)
	first, outcome := g.claim(t, p)
	require.Equal(t, recovery.OutcomeNew, outcome)
	g.expire(t, key)
	release()
	r := wait(t, done)
	require.NoError(t, r.err)
	require.Equal(t, recovery.OutcomeTakeover, r.outcome)
	require.Equal(t, first.ID, r.rec.ID)
	require.NotEqual(t, first.Owner, r.rec.Owner)
	require.Equal(t, 1, r.rec.Attempts, "the lease that ran out counts once")
	require.Contains(t, r.rec.LastError, "lease expired")
	require.Equal(t, 1, g.count(t))
	require.ErrorIs(t, g.store.Advance(g.ctx, first.Fence(), "x", nil), recovery.ErrLeaseLost)

	for name, other := range map[string]recovery.ClaimParams{
		"other principal": func() recovery.ClaimParams { q := p; q.Principal = "mallory"; return q }(),
		"other request":   params(t, key, `{"amount":999}`),
	} {
		key := recovery.Key{Tenant: "acme", ID: "late-insert-" + name}
		other.Key, p.Key = key, key
		done, release := g.stopped(t, other)
		g.claim(t, p)
		g.expire(t, key)
		release()
		r := wait(t, done)
		if name == "other principal" {
			require.ErrorIs(t, r.err, recovery.ErrForbidden, name)
		} else {
			require.ErrorIs(t, r.err, recovery.ErrMismatch, name)
		}
		rec := g.load(t, key)
		require.Zero(t, rec.Attempts, "%s: not taken over", name)
	}
}

// TestClaimRaceReadExpiredThenTakenOver: a claim reads an expired lease; before
// it writes, another claim takes the record over and commits. The first
// must not take it over too: one owner, one abandoned attempt counted.
func TestClaimRaceReadExpiredThenTakenOver(t *testing.T) {
	g := setupGated(t)
	key := recovery.Key{Tenant: "acme", ID: "read-then-taken"}
	p := params(t, key, `{"amount":100}`)
	g.claim(t, p)
	g.expire(t, key)

	done, release := g.stopped(t, p)
	winner, outcome := g.claim(t, p)
	require.Equal(t, recovery.OutcomeTakeover, outcome)
	release()
	r := wait(t, done)
	require.ErrorIs(t, r.err, recovery.ErrInFlight)
	rec := g.load(t, key)
	require.Equal(t, winner.Owner, rec.Owner, "the first takeover keeps the key")
	require.Equal(t, 1, rec.Attempts)

	// The same with the resume path's takeover as the winner.
	key.ID = "read-then-resumed"
	p.Key = key
	g.claim(t, p)
	g.expire(t, key)
	done, release = g.stopped(t, p)
	winner, outcome, err := seam.StoreOf(g.store).Takeover(g.ctx, key, "checkout")
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeTakeover, outcome)
	release()
	r = wait(t, done)
	require.ErrorIs(t, r.err, recovery.ErrInFlight)
	rec = g.load(t, key)
	require.Equal(t, winner.Owner, rec.Owner)
	require.Equal(t, 1, rec.Attempts)
}

// TestClaimRaceReadExpiredThenPruned: a claim reads an expired, request-less
// record; before it writes, the pruner deletes the record (its abandoned
// retention is over). Nothing is executed twice; and since there is no
// record left, the claim should own the key, as 0008's INSERT ... ON
// CONFLICT DO UPDATE did, instead of answering "in flight" for a key that
// no longer exists.
func TestClaimRaceReadExpiredThenPruned(t *testing.T) {
	g := setupGated(t)
	key := recovery.Key{Tenant: "acme", ID: "read-then-pruned"}
	p := params(t, key, `{"amount":100}`)
	p.Request = nil
	g.claim(t, p)
	g.expire(t, key)

	done, release := g.stopped(t, p)
	_, err := g.db.Exec(g.ctx, `DELETE FROM onceflow_keys WHERE tenant_id = $1 AND key = $2`, key.Tenant, key.ID)
	require.NoError(t, err)
	release()
	r := wait(t, done)
	require.NoError(t, r.err, "the key has no record: the claim owns it")
	require.Equal(t, recovery.OutcomeNew, r.outcome)
	require.Equal(t, 1, g.count(t))
}

// TestClaimRaceClaimRestoresLockTimeout: the claim sets lock_timeout (1 s,
// migration 0017) for its own writes; the caller's transaction must find
// its own setting afterwards, whatever the claim decided, and after a claim
// that found the key locked and was rolled back to a savepoint.
func TestClaimRaceClaimRestoresLockTimeout(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "timeout"}
	p := params(t, key, `{"amount":100}`)
	setting := func(t *testing.T, q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) string {
		var s string
		require.NoError(t, q.QueryRow(b.ctx, `SELECT current_setting('lock_timeout')`).Scan(&s))
		return s
	}
	inTx := func(t *testing.T, claim func(s *recovery.Store, tx pgx.Tx)) {
		t.Helper()
		tx, err := b.db.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(b.ctx) }()
		_, err = tx.Exec(b.ctx, `SET LOCAL lock_timeout = '3s'`)
		require.NoError(t, err)
		claim(b.store.WithTx(tx), tx)
		require.Equal(t, "3s", setting(t, tx))
		require.NoError(t, tx.Commit(b.ctx))
	}

	var first *recovery.Record
	inTx(t, func(s *recovery.Store, _ pgx.Tx) {
		rec, outcome, err := s.Claim(b.ctx, p)
		require.NoError(t, err)
		require.Equal(t, recovery.OutcomeNew, outcome)
		first = rec
	})
	inTx(t, func(s *recovery.Store, _ pgx.Tx) {
		_, _, err := s.Claim(b.ctx, p)
		require.ErrorIs(t, err, recovery.ErrInFlight)
	})
	b.expire(t, key)
	var taken *recovery.Record
	inTx(t, func(s *recovery.Store, _ pgx.Tx) {
		rec, outcome, err := s.Claim(b.ctx, p)
		require.NoError(t, err)
		require.Equal(t, recovery.OutcomeTakeover, outcome)
		taken = rec
	})
	require.NotEqual(t, first.Owner, taken.Owner)
	require.NoError(t, b.store.Complete(b.ctx, taken.Fence(), jsonResponse))
	inTx(t, func(s *recovery.Store, _ pgx.Tx) {
		_, outcome, err := s.Claim(b.ctx, p)
		require.NoError(t, err)
		require.Equal(t, recovery.OutcomeReplay, outcome)
	})

	// A claim refused by an uncommitted first claim, in a savepoint.
	busy := recovery.Key{Tenant: "acme", ID: "busy"}
	holder, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(b.ctx) }()
	_, _, err = b.store.WithTx(holder).Claim(b.ctx, params(t, busy, `{}`))
	require.NoError(t, err)
	inTx(t, func(_ *recovery.Store, tx pgx.Tx) {
		sp, err := tx.Begin(b.ctx)
		require.NoError(t, err)
		_, _, err = b.store.WithTx(sp).Claim(b.ctx, params(t, busy, `{}`))
		var inFlight *recovery.InFlightError
		require.ErrorAs(t, err, &inFlight)
		require.True(t, inFlight.Contended)
		require.NoError(t, sp.Rollback(b.ctx))
	})

	// Outside a transaction: the session's own setting stays.
	conn, err := b.db.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(b.ctx, `SET lock_timeout = '4s'`)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(b.ctx, `RESET lock_timeout`) }()
	s, err := recovery.New(conn, recovery.Config{})
	require.NoError(t, err)
	_, outcome, err := s.Claim(b.ctx, params(t, recovery.Key{Tenant: "acme", ID: "session"}, `{}`))
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeNew, outcome)
	require.Equal(t, "4s", setting(t, conn))
}

// TestClaimRaceStoreOnATransactionTimesOutCleanly: a Store made with New on a
// pgx.Tx (DBTX says a pgx.Tx will do) must answer a claim that found the
// key locked as in flight, like WithTx's does, not re-run the claim
// in the aborted transaction and report "current transaction is aborted".
func TestClaimRaceStoreOnATransactionTimesOutCleanly(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "busy"}
	holder, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(b.ctx) }()
	_, _, err = b.store.WithTx(holder).Claim(b.ctx, params(t, key, `{}`))
	require.NoError(t, err)

	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	s, err := recovery.New(tx, recovery.Config{})
	require.NoError(t, err)
	_, _, err = s.Claim(b.ctx, params(t, key, `{}`))
	var inFlight *recovery.InFlightError
	require.ErrorAs(t, err, &inFlight, "got %v", err)
	require.True(t, inFlight.Contended)
}

// TestClaimRaceDownTo0008AndBack: with records in flight, expired, released
// and finished, migrations 0010 and 0009 go down and up again, and claims
// decide the same after as before; in between, this build refuses to claim.
func TestClaimRaceDownTo0008AndBack(t *testing.T) {
	t.Parallel()
	db := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true}), 4)
	ctx := context.Background()
	m, err := migrations.New(db, migrations.Config{})
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	b := setupWith(t, db)

	round := 0
	check := func(t *testing.T) {
		t.Helper()
		round++
		k := func(name string) recovery.Key {
			return recovery.Key{Tenant: "acme", ID: name + "-" + string(rune('a'+round))}
		}
		held, expired, released, done := k("held"), k("expired"), k("released"), k("done")
		for _, key := range []recovery.Key{held, expired, released, done} {
			_, outcome := b.claim(t, params(t, key, `{}`))
			require.Equal(t, recovery.OutcomeNew, outcome)
		}
		b.expire(t, expired)
		r := b.load(t, released)
		require.NoError(t, b.store.Release(b.ctx, r.Fence(), "boom"))
		d := b.load(t, done)
		require.NoError(t, b.store.Complete(b.ctx, d.Fence(), jsonResponse))

		_, _, err := b.store.Claim(b.ctx, params(t, held, `{}`))
		require.ErrorIs(t, err, recovery.ErrInFlight)
		rec, outcome := b.claim(t, params(t, expired, `{}`))
		require.Equal(t, recovery.OutcomeTakeover, outcome)
		require.Equal(t, 1, rec.Attempts, "abandoned counts")
		rec, outcome = b.claim(t, params(t, released, `{}`))
		require.Equal(t, recovery.OutcomeTakeover, outcome)
		require.Equal(t, 1, rec.Attempts, "released counted once, at release")
		require.Equal(t, "boom", rec.LastError)
		_, outcome = b.claim(t, params(t, done, `{}`))
		require.Equal(t, recovery.OutcomeReplay, outcome)
		_, _, err = b.store.Claim(b.ctx, recovery.ClaimParams{Key: held, Workflow: "checkout", Principal: "other"})
		require.ErrorIs(t, err, recovery.ErrForbidden)
	}
	check(t)
	_, err = m.To(ctx, 8)
	require.NoError(t, err)
	// This build claims with a definition (migration 0010): on 0008 it
	// must say the database needs migrating, not claim half-way.
	_, _, err = b.store.Claim(b.ctx, params(t, recovery.Key{Tenant: "acme", ID: "at-0008"}, `{}`))
	require.ErrorIs(t, err, recovery.ErrNotMigrated)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	check(t)
	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE proname LIKE 'onceflow_%take_over'`).Scan(&n))
	require.Equal(t, 4, n, "the takeover rule and the takeover, each with and without p_undo (migration 0012)")
}
