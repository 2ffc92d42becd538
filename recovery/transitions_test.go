package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/recovery"
)

// TestStaleOwnerIsFencedOut: once a lease is taken over, every write by the
// old owner matches no row, reports ErrLeaseLost, and changes nothing.
func TestStaleOwnerIsFencedOut(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{"amount":100}`)
	stale, _ := b.claim(t, p)
	require.NoError(t, b.store.Advance(b.ctx, stale.Fence(), "create_order", []byte(`{"order_id":1}`)))
	b.expire(t, key)
	current, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeTakeover, outcome)
	before := b.load(t, key)
	version := b.rowVersion(t, key)

	f := stale.Fence()
	writes := map[string]func() error{
		"advance":  func() error { return b.store.Advance(b.ctx, f, "charge", []byte(`{"order_id":1,"charge":"ch_1"}`)) },
		"complete": func() error { return b.store.Complete(b.ctx, f, jsonResponse) },
		"fail":     func() error { return b.store.Fail(b.ctx, f, recovery.Response{Status: 500}, "x") },
		"renew": func() error {
			_, err := b.store.Renew(b.ctx, f, time.Minute)
			return err
		},
		"release":          func() error { return b.store.Release(b.ctx, f, "x") },
		"delete unstarted": func() error { return b.store.DeleteUnstarted(b.ctx, f) },
	}
	for name, write := range writes {
		require.ErrorIs(t, write(), recovery.ErrLeaseLost, name)
		require.Equal(t, before, b.load(t, key), "%s by a stale owner changed the record", name)
		require.Equal(t, version, b.rowVersion(t, key), "%s by a stale owner wrote a row version", name)
	}

	// The current owner's writes still land.
	require.NoError(t, b.store.Advance(b.ctx, current.Fence(), "charge", []byte(`{"order_id":1,"charge":"ch_1"}`)))
	require.NoError(t, b.store.Complete(b.ctx, current.Fence(), jsonResponse))
	require.Equal(t, recovery.StatusCompleted, b.load(t, key).Status)
}

// TestFencedWriteRollsBackWithTransaction: a stale owner writing its local
// rows and its recovery point in one transaction loses both.
func TestFencedWriteRollsBackWithTransaction(t *testing.T) {
	b := setup(t)
	_, err := b.db.Exec(b.ctx, `CREATE TABLE orders (id serial PRIMARY KEY, note text)`)
	require.NoError(t, err)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{}`)
	stale, _ := b.claim(t, p)
	b.expire(t, key)
	b.claim(t, p)

	err = pgx.BeginFunc(b.ctx, b.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `INSERT INTO orders (note) VALUES ('from the stale owner')`); err != nil {
			return err
		}
		return b.store.WithTx(tx).Advance(b.ctx, stale.Fence(), "create_order", nil)
	})
	require.ErrorIs(t, err, recovery.ErrLeaseLost)
	var orders int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM orders`).Scan(&orders))
	require.Zero(t, orders, "the stale owner's local write rolled back with its fenced write")
}

func TestAdvanceStoresRecoveryPointAndState(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	rec, _ := b.claim(t, params(t, key, `{}`))
	require.NoError(t, b.store.Advance(b.ctx, rec.Fence(), "create_order", []byte(`{"order_id":7}`)))
	require.NoError(t, b.store.Advance(b.ctx, rec.Fence(), "charge", []byte(`{"order_id":7,"charge_id":"ch_9"}`)))
	got := b.load(t, key)
	require.Equal(t, "charge", got.RecoveryPoint)
	require.JSONEq(t, `{"order_id":7,"charge_id":"ch_9"}`, string(got.State))
	require.Equal(t, rec.Owner, got.Owner)

	require.ErrorIs(t, b.store.Advance(b.ctx, rec.Fence(), "", nil), recovery.ErrInvalidInput)

	// A finished record takes no more recovery points.
	require.NoError(t, b.store.Complete(b.ctx, rec.Fence(), jsonResponse))
	require.ErrorIs(t, b.store.Advance(b.ctx, rec.Fence(), "late", nil), recovery.ErrLeaseLost)
	require.ErrorIs(t, b.store.Complete(b.ctx, rec.Fence(), jsonResponse), recovery.ErrLeaseLost, "a record completes once")
}

func TestCompleteRejectsBadStatus(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	rec, _ := b.claim(t, params(t, key, `{}`))
	require.ErrorIs(t, b.store.Complete(b.ctx, rec.Fence(), recovery.Response{Status: 0}), recovery.ErrInvalidInput)
	require.ErrorIs(t, b.store.Complete(b.ctx, rec.Fence(), recovery.Response{Status: 1000}), recovery.ErrInvalidInput)
	require.Equal(t, recovery.StatusInFlight, b.load(t, key).Status)
}

func TestReleaseKeepsWorkAndCountsAttempt(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	rec, _ := b.claim(t, params(t, key, `{}`))
	require.NoError(t, b.store.Advance(b.ctx, rec.Fence(), "create_order", []byte(`{"order_id":1}`)))

	// Messages that PostgreSQL text cannot hold as given are cleaned, not lost.
	cause := "provider said \x00 \xff " + strings.Repeat("x", 2*recovery.MaxErrorLength)
	require.NoError(t, b.store.Release(b.ctx, rec.Fence(), cause))
	got := b.load(t, key)
	require.Equal(t, recovery.StatusInFlight, got.Status)
	require.True(t, got.Released)
	require.True(t, got.LockedUntil.IsZero())
	require.Equal(t, 1, got.Attempts)
	require.Equal(t, "create_order", got.RecoveryPoint, "the recovery point survives a release")
	require.True(t, strings.HasPrefix(got.LastError, "provider said \uFFFD \uFFFD xxx"), got.LastError[:40])
	require.LessOrEqual(t, len(got.LastError), recovery.MaxErrorLength)
	require.True(t, utf8.ValidString(got.LastError))

	require.ErrorIs(t, b.store.Release(b.ctx, rec.Fence(), "again"), recovery.ErrLeaseLost,
		"a released owner token is retired")
	require.Equal(t, 1, b.load(t, key).Attempts)
}

func TestRenewExtendsLeaseOnDatabaseClock(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{}`)
	p.Lease = 2 * time.Second
	rec, _ := b.claim(t, p)

	until, err := b.store.Renew(b.ctx, rec.Fence(), time.Hour)
	require.NoError(t, err)
	var dbNow time.Time
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT clock_timestamp()`).Scan(&dbNow))
	within(t, time.Hour, until.Sub(dbNow), 5*time.Second)
	require.Equal(t, until, b.load(t, key).LockedUntil)

	_, err = b.store.Renew(b.ctx, rec.Fence(), -time.Second)
	require.ErrorIs(t, err, recovery.ErrInvalidInput)

	// Renewing keeps a live attempt's key: a claim now sees it in flight.
	_, _, err = b.store.Claim(b.ctx, p)
	require.ErrorIs(t, err, recovery.ErrInFlight)
}

func TestDeleteUnstarted(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{}`)
	rec, _ := b.claim(t, p)
	require.NoError(t, b.store.DeleteUnstarted(b.ctx, rec.Fence()))
	_, err := b.store.Load(b.ctx, key)
	require.ErrorIs(t, err, recovery.ErrNotFound)

	// Once a recovery point is committed, the record stays.
	rec, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeNew, outcome, "the client may retry at once")
	require.NoError(t, b.store.Advance(b.ctx, rec.Fence(), "create_order", nil))
	require.ErrorIs(t, b.store.DeleteUnstarted(b.ctx, rec.Fence()), recovery.ErrStarted)
	require.Equal(t, "create_order", b.load(t, key).RecoveryPoint)

	unknown := recovery.Fence{Key: key, Owner: uuid.New()}
	require.ErrorIs(t, b.store.DeleteUnstarted(b.ctx, unknown), recovery.ErrLeaseLost)
}

// TestStoreUsesConfiguredSchema: with tables in their own schema and a
// search_path that does not name it, every transition still works, because
// each statement qualifies its tables.
func TestStoreUsesConfiguredSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The database's default, not a startup parameter: PgBouncer refuses those.
	db := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true,
		Settings: map[string]string{"search_path": "pg_catalog"}}), 0)
	m, err := migrations.New(db, migrations.Config{Schema: "idem"})
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)

	store, err := recovery.New(db, recovery.Config{Schema: "idem"})
	require.NoError(t, err)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{}`)
	rec, outcome, err := store.Claim(ctx, p)
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeNew, outcome)
	require.NoError(t, store.Advance(ctx, rec.Fence(), "step", nil))
	_, err = store.Renew(ctx, rec.Fence(), 0)
	require.NoError(t, err)
	require.NoError(t, store.Complete(ctx, rec.Fence(), jsonResponse))
	_, outcome, err = store.Claim(ctx, p)
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeReplay, outcome)

	var rows int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM idem.onceflow_keys`).Scan(&rows))
	require.Equal(t, 1, rows)

	_, err = recovery.New(db, recovery.Config{Schema: strings.Repeat("s", 64)})
	require.Error(t, err)
}

func TestAdvanceExtendsLease(t *testing.T) {
	b := setup(t)
	store, err := recovery.New(b.db, recovery.Config{Lease: time.Hour})
	require.NoError(t, err)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{}`)
	p.Lease = time.Second
	rec, _, err := store.Claim(b.ctx, p)
	require.NoError(t, err)
	within(t, time.Second, rec.LockedUntil.Sub(rec.CreatedAt), 500*time.Millisecond)

	require.NoError(t, store.Advance(b.ctx, rec.Fence(), "step", nil))
	got := b.load(t, key)
	within(t, time.Hour, got.LockedUntil.Sub(got.UpdatedAt), time.Second)

	_, err = recovery.New(b.db, recovery.Config{Lease: time.Microsecond})
	require.ErrorIs(t, err, recovery.ErrInvalidInput)
}

func TestTakeoverWithoutRequest(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	_, _, err := seam.StoreOf(b.store).Takeover(b.ctx, key, "checkout")
	require.ErrorIs(t, err, recovery.ErrNotFound, "a takeover never creates a record")
	require.Zero(t, b.count(t))

	first, _ := b.claim(t, params(t, key, `{"amount":100}`))
	require.NoError(t, b.store.Advance(b.ctx, first.Fence(), "create_order", []byte(`{"order_id":1}`)))
	_, _, err = seam.StoreOf(b.store).Takeover(b.ctx, key, "checkout")
	require.ErrorIs(t, err, recovery.ErrInFlight, "a valid lease is respected")

	b.expire(t, key)
	rec, outcome, err := seam.StoreOf(b.store).Takeover(b.ctx, key, "checkout")
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeTakeover, outcome)
	require.NotEqual(t, first.Owner, rec.Owner)
	require.Equal(t, "create_order", rec.RecoveryPoint)
	require.JSONEq(t, `{"amount":100}`, string(rec.Request), "the stored request comes back for resuming")
	require.Equal(t, 1, rec.Attempts)
	require.ErrorIs(t, b.store.Advance(b.ctx, first.Fence(), "charge", nil), recovery.ErrLeaseLost)

	require.NoError(t, b.store.Complete(b.ctx, rec.Fence(), jsonResponse))
	replay, outcome, err := seam.StoreOf(b.store).Takeover(b.ctx, key, "checkout")
	require.NoError(t, err)
	require.Equal(t, recovery.OutcomeReplay, outcome)
	require.Equal(t, jsonResponse.Body, replay.Response.Body)
}

func TestConcurrentTakeoverAndClaimOneWinner(t *testing.T) {
	t.Parallel()
	b := setupWith(t, dbtest.NewPool(t, 16))
	for round := range 20 {
		key := recovery.Key{Tenant: "acme", ID: fmt.Sprintf("mixed-%d", round)}
		p := params(t, key, `{}`)
		b.claim(t, p)
		b.expire(t, key)
		var (
			wg       sync.WaitGroup
			start    = make(chan struct{})
			wins     atomic.Int32
			inFlight atomic.Int32
		)
		for i := range 16 {
			wg.Go(func() {
				<-start
				var err error
				if i%2 == 0 {
					_, _, err = seam.StoreOf(b.store).Takeover(b.ctx, key, "checkout")
				} else {
					_, _, err = b.store.Claim(b.ctx, p)
				}
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, recovery.ErrInFlight):
					inFlight.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		require.EqualValues(t, 1, wins.Load(), "round %d", round)
		require.EqualValues(t, 15, inFlight.Load(), "round %d: every loser sees the key in flight", round)
	}
}

func TestExpireLease(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	require.ErrorIs(t, b.store.ExpireLease(b.ctx, key), recovery.ErrNotFound)
	rec, _ := b.claim(t, params(t, key, `{}`))
	require.NoError(t, b.store.ExpireLease(b.ctx, key))
	got := b.load(t, key)
	require.Equal(t, rec.Owner, got.Owner, "expiring does not change the owner; a takeover does")
	require.False(t, got.Released)

	require.NoError(t, b.store.Release(b.ctx, rec.Fence(), "x"))
	require.NoError(t, b.store.ExpireLease(b.ctx, key))
	require.True(t, b.load(t, key).Released, "a released lease stays released")

	taken, _, err := seam.StoreOf(b.store).Takeover(b.ctx, key, "checkout")
	require.NoError(t, err)
	require.NoError(t, b.store.Complete(b.ctx, taken.Fence(), jsonResponse))
	require.ErrorIs(t, b.store.ExpireLease(b.ctx, key), recovery.ErrNotFound, "a finished record has no lease")
}

func TestCompleteAfterRecordsFinalStep(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	rec, _ := b.claim(t, params(t, key, `{}`))
	require.NoError(t, b.store.Advance(b.ctx, rec.Fence(), "create_order", []byte(`{"order_id":1}`)))
	require.NoError(t, seam.StoreOf(b.store).CompleteAfter(b.ctx, rec.Fence(), "mark_paid", []byte(`{"order_id":1,"paid":true}`), jsonResponse))
	got := b.load(t, key)
	require.Equal(t, recovery.StatusCompleted, got.Status)
	require.Equal(t, "mark_paid", got.RecoveryPoint)
	require.JSONEq(t, `{"order_id":1,"paid":true}`, string(got.State))
	require.Equal(t, jsonResponse.Body, got.Response.Body)

	// Plain Complete keeps what was recorded before.
	other := recovery.Key{Tenant: "acme", ID: "k2"}
	rec, _ = b.claim(t, params(t, other, `{}`))
	require.NoError(t, b.store.Advance(b.ctx, rec.Fence(), "create_order", []byte(`{"order_id":2}`)))
	require.NoError(t, b.store.Complete(b.ctx, rec.Fence(), jsonResponse))
	got = b.load(t, other)
	require.Equal(t, "create_order", got.RecoveryPoint)
	require.JSONEq(t, `{"order_id":2}`, string(got.State))
}

func TestListForOperators(t *testing.T) {
	b := setup(t)
	stuck, _ := b.claim(t, params(t, recovery.Key{Tenant: "acme", ID: "stuck"}, `{}`))
	_, err := b.db.Exec(b.ctx, `UPDATE onceflow_keys SET updated_at = now() - interval '2 hours' WHERE key = 'stuck'`)
	require.NoError(t, err)
	b.claim(t, params(t, recovery.Key{Tenant: "acme", ID: "busy"}, `{}`))
	done, _ := b.claim(t, params(t, recovery.Key{Tenant: "globex", ID: "done"}, `{}`))
	require.NoError(t, b.store.Complete(b.ctx, done.Fence(), jsonResponse))

	keys := func(f recovery.ListFilter) []string {
		recs, err := b.store.List(b.ctx, f)
		require.NoError(t, err)
		var ids []string
		for _, r := range recs {
			ids = append(ids, r.Key.ID)
		}
		return ids
	}
	require.Equal(t, []string{"stuck", "busy", "done"}, keys(recovery.ListFilter{}), "least recently updated first")
	require.Equal(t, []string{"stuck", "busy"}, keys(recovery.ListFilter{Tenant: "acme"}))
	require.Equal(t, []string{"done"}, keys(recovery.ListFilter{Status: recovery.StatusCompleted}))
	require.Equal(t, []string{"stuck"}, keys(recovery.ListFilter{StuckFor: time.Hour}))
	require.Equal(t, []string{"stuck"}, keys(recovery.ListFilter{Limit: 1}))
	require.Equal(t, stuck.Owner, b.load(t, stuck.Key).Owner)
}

func TestHandBackDoesNotCountAnAttempt(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	rec, _ := b.claim(t, params(t, key, `{}`))
	require.NoError(t, seam.StoreOf(b.store).HandBack(b.ctx, rec.Fence(), "caller went away"))
	got := b.load(t, key)
	require.True(t, got.Released)
	require.Zero(t, got.Attempts)
	require.Equal(t, "caller went away", got.LastError)
	require.ErrorIs(t, seam.StoreOf(b.store).HandBack(b.ctx, rec.Fence(), "again"), recovery.ErrLeaseLost)

	taken, outcome := b.claim(t, params(t, key, `{}`))
	require.Equal(t, recovery.OutcomeTakeover, outcome)
	require.Zero(t, taken.Attempts, "a handed-back lease is not an abandoned one")
}

func TestStoredIsWhatReplaysReturn(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	rec, _ := b.claim(t, params(t, key, `{}`))
	resp := recovery.Response{Status: 201, Header: map[string][]string{"content-type": {"a/b"}, "X-Secret": {"s"}}}
	require.NoError(t, b.store.Complete(b.ctx, rec.Fence(), resp))
	replay, _ := b.claim(t, params(t, key, `{}`))
	require.Equal(t, seam.StoreOf(b.store).Stored(resp), *replay.Response)
}
