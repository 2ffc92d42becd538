package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/pgtrace"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// newAtomicServer is newServer with Config.Atomic, on a pool whose
// statements and commits are counted.
func newAtomicServer(t *testing.T, cfg idemhttp.Config) (*server, *pgtrace.Counter) {
	t.Helper()
	t.Parallel()
	pcfg, err := pgxpool.ParseConfig(dbtest.NewDatabase(t, dbtest.Options{}))
	require.NoError(t, err)
	counter := &pgtrace.Counter{}
	pcfg.ConnConfig.Tracer = counter
	dbtest.CheckRouting(t, pcfg.ConnConfig)
	pcfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg.Atomic = true
	return newServerOn(t, pool, cfg, nil), counter
}

// held returns a channel a handler closes when it is entered, one it waits
// on, and the function that frees it, which also runs when the test ends
// (before its server closes), so that a test failing while a handler waits
// ends at once.
func held(t *testing.T) (entered, release chan struct{}, free func()) {
	entered, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	free = func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	return entered, release, free
}

// TestAtomicCommitsOnce: with Config.Atomic, the claim opens the request's
// transaction, and the handler's write and the stored response commit in
// it: one commit for the request, where the claim committed on its own
// before. The record is the same as without Atomic, and so is the replay.
func TestAtomicCommitsOnce(t *testing.T) {
	s, counter := newAtomicServer(t, idemhttp.Config{})
	before := counter.Counts()
	first := s.post("/v1/charges", "k1", "acme", `{"amount": 100}`)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	got := counter.Counts().Sub(before)
	require.EqualValues(t, 1, got.Commits, "one commit for the claim, the handler's write and the response: %+v", got)
	require.EqualValues(t, 3, got.RoundTrips(), "BEGIN with the claim, the handler's insert, the response with the COMMIT: %+v", got)
	require.Equal(t, 1, s.rows())

	replay := s.post("/v1/charges", "k1", "acme", `{"amount": 100}`)
	require.Equal(t, first.status, replay.status)
	require.Equal(t, first.body, replay.body)
	require.Equal(t, "true", replay.header.Get(idemhttp.ReplayedHeader))
	require.EqualValues(t, 1, s.runs.Load())
	require.Equal(t, 1, s.rows())

	var status string
	var entries int
	require.NoError(t, s.db.QueryRow(context.Background(), `SELECT status, jsonb_array_length(history->'entries')
		FROM onceflow_keys WHERE tenant_id = 'acme' AND key = 'k1'`).Scan(&status, &entries))
	require.Equal(t, "completed", status)
	require.Equal(t, 2, entries, "claimed, completed")
}

// TestAtomicDuplicateIsRefusedAtOnce: while an Atomic handler runs, its key
// has no committed record, but the key's lock, held by the request's
// transaction, answers a duplicate 409 at once; once the first answered,
// the duplicate gets its stored response.
func TestAtomicDuplicateIsRefusedAtOnce(t *testing.T) {
	s, _ := newAtomicServer(t, idemhttp.Config{})
	entered, release, free := held(t)
	var calls atomic.Int32
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			close(entered)
			<-release
		}
		s.charge(w, r)
	}
	done := make(chan reply, 1)
	go func() { done <- s.post("/v1/charges", "k1", "acme", `{"amount": 100}`) }()
	<-entered

	var dup reply
	waits := dbtest.LockWaits(t, s.db, func() { dup = s.post("/v1/charges", "k1", "acme", `{"amount": 100}`) })
	require.Equal(t, http.StatusConflict, dup.status, dup.body)
	require.NotEmpty(t, dup.header.Get("Retry-After"))
	require.Zero(t, waits, "the duplicate waited on a lock")
	free()
	first := <-done
	require.Equal(t, http.StatusCreated, first.status, first.body)

	again := s.post("/v1/charges", "k1", "acme", `{"amount": 100}`)
	require.Equal(t, first.body, again.body)
	require.EqualValues(t, 1, calls.Load(), "the handler ran once")
	require.Equal(t, 1, s.rows())
}

// TestAtomicFailureLeavesNothing: an Atomic request whose response is not
// stored (a 500, a panic) rolls back its claim with the handler's writes:
// no record, no row, and the retry runs the handler afresh.
func TestAtomicFailureLeavesNothing(t *testing.T) {
	s, _ := newAtomicServer(t, idemhttp.Config{})
	var fail atomic.Bool
	fail.Store(true)
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			tx, err := idemhttp.Tx(r.Context())
			if err == nil {
				_, err = tx.Exec(r.Context(), `INSERT INTO charges (body) VALUES ('failed')`)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusTeapot) // stored: fails the test
				return
			}
			if strings.Contains(r.URL.Path, "refunds") {
				panic("handler bug")
			}
			http.Error(w, "downstream is down", http.StatusInternalServerError)
			return
		}
		s.charge(w, r)
	}
	for _, path := range []string{"/v1/charges", "/v1/refunds"} {
		failed := s.post(path, "k-"+path, "acme", `{"amount": 100}`)
		require.Equal(t, http.StatusInternalServerError, failed.status, path)
	}
	require.Zero(t, s.rows(), "the handler's writes rolled back")
	var keys int
	require.NoError(t, s.db.QueryRow(context.Background(), `SELECT count(*) FROM onceflow_keys`).Scan(&keys))
	require.Zero(t, keys, "no record: the claims rolled back")

	fail.Store(false)
	done := s.post("/v1/charges", "k-/v1/charges", "acme", `{"amount": 100}`)
	require.Equal(t, http.StatusCreated, done.status, done.body)
	require.Equal(t, 1, s.rows())
}

// TestAtomicStreamsAnOversizedResponseWithoutTx: an Atomic handler that
// never called Tx and answers more than MaxResponse has its response
// streamed, as without Atomic; nothing is kept.
func TestAtomicStreamsAnOversizedResponseWithoutTx(t *testing.T) {
	s, _ := newAtomicServer(t, idemhttp.Config{MaxResponse: 10})
	big := strings.Repeat("x", 100)
	s.handle = func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(big)) }
	got := s.post("/v1/charges", "k1", "acme", `{}`)
	require.Equal(t, http.StatusOK, got.status)
	require.Equal(t, big, got.body)
	var keys int
	require.NoError(t, s.db.QueryRow(context.Background(), `SELECT count(*) FROM onceflow_keys`).Scan(&keys))
	require.Zero(t, keys)
}

// TestAtomicLosesToALocklessClaim: a build from before migration 0014,
// during a rolling deploy, claims without the key's lock, so it can
// commit a record for the key while an Atomic handler runs. The handler's
// response then cannot be stored: its writes roll back, and the client is
// told to retry, which gets the other claim's answer.
func TestAtomicLosesToALocklessClaim(t *testing.T) {
	s, _ := newAtomicServer(t, idemhttp.Config{})
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		if _, err := s.db.Exec(r.Context(), `INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, owner, locked_until)
			VALUES ('acme', 'k1', gen_random_uuid(), 'POST /v1/charges', '\x00', gen_random_uuid(), clock_timestamp() + interval '1 minute')`); err != nil {
			http.Error(w, err.Error(), http.StatusTeapot)
			return
		}
		s.charge(w, r)
	}
	got := s.post("/v1/charges", "k1", "acme", `{}`)
	require.Equal(t, http.StatusConflict, got.status, got.body)
	require.Zero(t, s.rows(), "the handler's write rolled back")
}

// TestAtomicHoldsNoLease: an Atomic handler that outlives the lease is
// not cut off, and no other request takes its key meanwhile: no record is
// committed for a lease to expire on; the key's lock holds it.
func TestAtomicHoldsNoLease(t *testing.T) {
	lease := 50 * time.Millisecond
	s, _ := newAtomicServer(t, idemhttp.Config{Lease: lease})
	entered, release, free := held(t)
	var (
		calls atomic.Int32
		cut   atomic.Bool
	)
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			close(entered)
			<-release
			cut.Store(r.Context().Err() != nil)
		}
		s.charge(w, r)
	}
	done := make(chan reply, 1)
	go func() { done <- s.post("/v1/charges", "k1", "acme", `{}`) }()
	<-entered
	var dbNow, until time.Time
	require.NoError(t, s.db.QueryRow(context.Background(), `SELECT clock_timestamp(), clock_timestamp() + $1::interval`,
		(3*lease).String()).Scan(&dbNow, &until))
	for dbNow.Before(until) { // three leases by the database clock
		require.NoError(t, s.db.QueryRow(context.Background(), `SELECT clock_timestamp() FROM pg_sleep(0.01)`).Scan(&dbNow))
	}
	dup := s.post("/v1/charges", "k1", "acme", `{}`)
	require.Equal(t, http.StatusConflict, dup.status, dup.body)
	free()
	require.Equal(t, http.StatusCreated, (<-done).status)
	require.False(t, cut.Load(), "the handler's context is not cut by the lease")
	require.EqualValues(t, 1, calls.Load())
}

// TestAtomicFrozenHandlerFreesTheKeyAfterIdleTimeout: no lease is
// committed for an Atomic request; its open transaction alone holds the
// key. A handler that leaves that transaction waiting for IdleTimeout (a
// frozen process, one cut off from the server) has it ended by the server
// (the claim's idle_in_transaction_session_timeout), so a retry gets the
// key instead of 409 until TCP keepalives notice. The frozen handler's
// write rolls back; one charge, the retry's, which every later retry
// replays.
func TestAtomicFrozenHandlerFreesTheKeyAfterIdleTimeout(t *testing.T) {
	idle := 2 * time.Second // the retries' own transactions pause far less, even on a loaded machine
	s, _ := newAtomicServer(t, idemhttp.Config{IdleTimeout: idle})
	entered, release, free := held(t)
	var calls atomic.Int32
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			tx, err := idemhttp.Tx(r.Context())
			if err == nil {
				_, err = tx.Exec(r.Context(), `INSERT INTO charges (body) VALUES ('frozen')`)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			close(entered)
			<-release // frozen: deaf to its context, as a stopped process is
		}
		s.charge(w, r)
	}
	done := make(chan reply, 1)
	go func() { done <- s.post("/v1/charges", "k1", "acme", `{}`) }()
	<-entered

	// Retries while the key is held, as a client would; the bound is many
	// timeouts, so that only a key held for good fails the test.
	deadline := time.Now().Add(30 * idle)
	retry := s.post("/v1/charges", "k1", "acme", `{}`)
	for retry.status == http.StatusConflict && time.Now().Before(deadline) {
		time.Sleep(idle / 10)
		retry = s.post("/v1/charges", "k1", "acme", `{}`)
	}
	require.Equal(t, http.StatusCreated, retry.status, "after %s: %s", 30*idle, retry.body)
	free()
	frozen := <-done
	require.GreaterOrEqual(t, frozen.status, 500, "the frozen handler's transaction was ended: %s", frozen.body)
	replay := s.post("/v1/charges", "k1", "acme", `{}`)
	require.Equal(t, http.StatusCreated, replay.status)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	require.Equal(t, retry.body, replay.body)
	require.EqualValues(t, 2, calls.Load())
	require.Equal(t, 1, s.rows(), "the frozen handler's write rolled back")
}

// TestAtomicOnAReadOnlyServer: TestMiddlewareOnAReadOnlyServer with
// Config.Atomic. Since migration 0019 the claim that opens an Atomic
// request's transaction writes nothing for a new key (it takes the key's
// advisory lock and reads), so a standby (default_transaction_read_only,
// or a hot standby, where advisory locks work) lets it through: the
// handler runs, its write through Tx is refused with 25006, the handler
// answers 500 (not stored) and the middleware never sees a write refused
// as read-only. The request is not the promised 503 with Retry-After, and
// the pool is never reset: once the primary takes writes again, every
// request on the pool's old connections still fails.
func TestAtomicOnAReadOnlyServer(t *testing.T) {
	t.Parallel()
	url := dbtest.DirectURL(t, dbtest.NewDatabase(t, dbtest.Options{}))
	pool := dbtest.Connect(t, url, 2)
	s := newServerOn(t, pool, idemhttp.Config{Atomic: true}, nil)

	dbtest.SetReadOnly(t, url, true)
	pool.Reset() // the pool's connections now land on a "standby"
	refused := s.post("/v1/charges", "k1", "acme", `{"amount": 1}`)
	assert.Equal(t, http.StatusServiceUnavailable, refused.status, refused.body)
	assert.Equal(t, "1", refused.header.Get("Retry-After"))
	assert.Zero(t, s.runs.Load(), "nothing runs without the key's protection")

	dbtest.SetReadOnly(t, url, false) // the new primary
	done := s.post("/v1/charges", "k1", "acme", `{"amount": 1}`)
	require.Equal(t, http.StatusCreated, done.status, "a connection still on the read-only server was reused: %s", done.body)
	require.Equal(t, 1, s.rows())
}

// TestTxUsedAfterTheHandlerReturnedIsRefused: a handler that keeps its
// Tx past its return (a goroutine it started, a deferred log write) must
// be refused: Tx's doc says not to, and a late write cannot be part of the
// stored response's transaction. Nothing refuses it. With Atomic, Tx is an
// opentx.Tx on the claim's *pgx.Conn, which knows nothing of the commit;
// without, it is a pgx.Tx whose COMMIT the middleware sent as a statement
// (CompleteAndCommit's batch), so pgx never marked it closed. Either way,
// once the connection is back in the pool, the late statement runs on
// whatever transaction is open there, here the next request's, for another
// key, and commits (or rolls back) with that request, with no error to
// the writer.
func TestTxUsedAfterTheHandlerReturnedIsRefused(t *testing.T) {
	t.Parallel()
	for _, atomic := range []bool{true, false} {
		t.Run(fmt.Sprintf("atomic=%v", atomic), func(t *testing.T) { testTxUsedAfterTheHandlerReturned(t, atomic) })
	}
}

func testTxUsedAfterTheHandlerReturned(t *testing.T, atomic bool) {
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	pool := dbtest.Connect(t, url, 1) // one connection: the next request gets the same one
	check := dbtest.Connect(t, url, 1)
	s := newServerOn(t, pool, idemhttp.Config{Atomic: atomic}, nil)
	ctx := context.Background()

	late, lateErr := make(chan struct{}), make(chan error, 1)
	inB, lateDone := make(chan struct{}), make(chan struct{})
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		tx, err := idemhttp.Tx(r.Context())
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if r.Header.Get("Idempotency-Key") == "a" {
			if _, err := tx.Exec(r.Context(), `INSERT INTO charges (body) VALUES ('a')`); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			go func() { // keeps tx past the handler's return
				<-late
				_, err := tx.Exec(context.Background(), `INSERT INTO charges (body) VALUES ('a, late')`)
				lateErr <- err
			}()
			w.WriteHeader(http.StatusCreated)
			return
		}
		close(inB) // b's transaction is open on the pool's one connection
		<-lateDone
		w.WriteHeader(http.StatusCreated)
	}
	require.Equal(t, http.StatusCreated, s.post("/v1/charges", "a", "acme", `{}`).status)

	b := make(chan reply, 1)
	go func() { b <- s.post("/v1/charges", "b", "acme", `{}`) }()
	<-inB
	close(late)
	err := <-lateErr
	close(lateDone)
	require.Equal(t, http.StatusCreated, (<-b).status)

	var lateRows int
	require.NoError(t, check.QueryRow(ctx, `SELECT count(*) FROM charges WHERE body = 'a, late'`).Scan(&lateRows))
	require.Zero(t, lateRows, "request a's late write was committed by request b's transaction")
	require.Error(t, err, "a's Tx was used after its handler returned and nothing refused it")
}

// TestAtomicStreamingReleasesItsConnection: an Atomic handler that never
// called Tx and answers more than MaxResponse has its answer streamed, not
// stored: the claim's transaction is rolled back and its connection
// released as the streaming starts, so that a slow reader holds no
// connection.
func TestAtomicStreamingReleasesItsConnection(t *testing.T) {
	s, _ := newAtomicServer(t, idemhttp.Config{MaxResponse: 10})
	entered, release, free := held(t)
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(strings.Repeat("x", 100))) // over MaxResponse: streamed from here
		close(entered)
		<-release
		_, _ = w.Write([]byte("y"))
	}
	done := make(chan reply, 1)
	go func() { done <- s.post("/v1/charges", "k1", "acme", `{}`) }()
	<-entered
	require.Zero(t, s.db.Stat().AcquiredConns(), "a connection is held while the answer streams")
	free()
	got := <-done
	require.Equal(t, strings.Repeat("x", 100)+"y", got.body)
}

// TestAtomicHandlersTakingASecondConnection: Atomic requests hold a
// connection through their handler; a handler that reads through the
// pool besides its Tx takes a second. The middleware leaves the pool's
// last connection to such reads (poolgate), so that requests as many as
// the pool's connections, each waiting for a second, do not deadlock.
func TestAtomicHandlersTakingASecondConnection(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t, 4)
	s := newServerOn(t, pool, idemhttp.Config{Atomic: true}, nil)
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		// A deadlock would wait for ever: bounded, it fails the request.
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&n); err != nil {
			http.Error(w, "a second connection: "+err.Error(), http.StatusTeapot)
			return
		}
		s.charge(w, r)
	}
	const requests = 8
	answers := make(chan reply, requests)
	for i := range requests {
		go func() { answers <- s.post("/v1/charges", fmt.Sprintf("k%d", i), "acme", `{}`) }()
	}
	for range requests {
		got := <-answers
		require.Equal(t, http.StatusCreated, got.status, got.body)
	}
	require.Equal(t, requests, s.rows())
}

// TestEngineAndAtomicRequestsShareOnePool: a workflow engine and Atomic
// requests on one pool share one gate, so that together they hold at
// most all but one of its connections. While the engine's attempts hold
// every place, an Atomic request waits for one (and, past DBTimeout, is
// answered 503, nothing run) instead of taking the last connection, which
// a renewal still gets; under load from both, with each holder taking a
// second connection, no more than MaxConns-1 hold one at once, and every
// run and request finishes.
//
// Before, each built a gate of its own: together they could hold 2N-2
// connections of N, starving the engine's renewals and deadlocking holders
// that wait for a second connection.
func TestEngineAndAtomicRequestsShareOnePool(t *testing.T) {
	t.Parallel()
	const conns = 4
	pool := dbtest.NewPool(t, conns)
	s := newServerOn(t, pool, idemhttp.Config{Atomic: true, DBTimeout: 500 * time.Millisecond}, nil)
	e, err := workflow.NewEngine(pool, workflow.Config{})
	require.NoError(t, err)

	var holders, most atomic.Int32 // holders of a gated connection, now and at most
	hold := func(ctx context.Context) error {
		defer holders.Add(-1)
		n := holders.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		// A second connection: a deadlock would wait for ever, bounded it fails.
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var one int
		if err := pool.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
			return fmt.Errorf("a second connection: %w", err)
		}
		return nil
	}
	var (
		block   atomic.Bool
		entered = make(chan struct{}, conns)
		release = make(chan struct{})
		free    = sync.OnceFunc(func() { close(release) })
	)
	t.Cleanup(free) // before the pool closes, should the test fail while they hold it
	wf := workflow.Define("shares_the_pool",
		phase.Atomic("hold", func(ctx context.Context, _ pgx.Tx, _ *phase.Run[Payment, Paid]) error {
			if block.Load() {
				entered <- struct{}{}
				<-release
			}
			return hold(ctx)
		}))
	run := func(key string) error {
		_, err := wf.Run(context.Background(), e, workflow.Key{Tenant: "acme", ID: key}, Payment{AmountCents: 1})
		return err
	}

	// The engine's attempts take every place.
	block.Store(true)
	held := make(chan error, conns-1)
	for i := range conns - 1 {
		go func() { held <- run(fmt.Sprintf("held-%d", i)) }()
	}
	for range conns - 1 {
		<-entered
	}
	got := s.post("/v1/charges", "while-held", "acme", `{}`)
	require.Equal(t, http.StatusServiceUnavailable, got.status, "the request waited for a place, not for the last connection: %s", got.body)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var one int
	require.NoError(t, pool.QueryRow(ctx, `SELECT 1`).Scan(&one), "the last connection is free for a renewal")
	block.Store(false)
	free()
	for range conns - 1 {
		require.NoError(t, <-held)
	}

	// Both at once, every holder taking a second connection.
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		if err := hold(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusTeapot)
			return
		}
		s.charge(w, r)
	}
	const each = 8
	errs := make(chan error, 2*each)
	for i := range each {
		go func() { errs <- run(fmt.Sprintf("run-%d", i)) }()
		go func() {
			got := s.post("/v1/charges", fmt.Sprintf("request-%d", i), "acme", `{}`)
			if got.status != http.StatusCreated {
				errs <- fmt.Errorf("request %d: %d %s", i, got.status, got.body)
				return
			}
			errs <- nil
		}()
	}
	for range 2 * each {
		require.NoError(t, <-errs)
	}
	require.LessOrEqual(t, most.Load(), int32(conns-1), "holders of a connection at once, engine and requests together")
}

// TestCaughtStatementErrorIsNotStored: a handler that catches a failed
// statement in Tx (a unique violation it answers 409) leaves the
// transaction aborted, and PostgreSQL commits none of it: the answer
// cannot be stored with its writes. It is 500, not stored, and not the
// 503 "retry with the same key" of a storage failure, which every retry
// would get again; in a savepoint (Tx's Begin) the caught error leaves the
// transaction usable, and the 409 is stored and replayed.
func TestCaughtStatementErrorIsNotStored(t *testing.T) {
	t.Parallel()
	for _, isAtomic := range []bool{false, true} {
		t.Run(fmt.Sprintf("atomic=%v", isAtomic), func(t *testing.T) {
			t.Parallel()
			pool := dbtest.NewPool(t, 4)
			s := newServerOn(t, pool, idemhttp.Config{Atomic: isAtomic}, nil)
			_, err := pool.Exec(context.Background(), `CREATE TABLE names (name text PRIMARY KEY); INSERT INTO names VALUES ('taken')`)
			require.NoError(t, err)
			var savepoint atomic.Bool
			s.handle = func(w http.ResponseWriter, r *http.Request) {
				tx, err := idemhttp.Tx(r.Context())
				if err != nil {
					http.Error(w, err.Error(), http.StatusTeapot)
					return
				}
				insert := func(tx interface {
					Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
				}) error {
					_, err := tx.Exec(r.Context(), `INSERT INTO names VALUES ('taken')`)
					return err
				}
				if savepoint.Load() {
					var sp pgx.Tx
					sp, err = tx.Begin(r.Context())
					if err == nil {
						if err = insert(sp); err != nil {
							err = errors.Join(err, sp.Rollback(r.Context()))
						} else {
							err = sp.Commit(r.Context())
						}
					}
				} else {
					err = insert(tx)
				}
				if err != nil {
					http.Error(w, "name taken", http.StatusConflict)
					return
				}
				w.WriteHeader(http.StatusCreated)
			}
			for range 2 {
				got := s.post("/v1/charges", "k1", "acme", `{}`)
				require.Equal(t, http.StatusInternalServerError, got.status, got.body)
				require.Contains(t, problemOf(t, got), "a statement in its transaction failed")
			}
			savepoint.Store(true)
			got := s.post("/v1/charges", "k1", "acme", `{}`)
			require.Equal(t, http.StatusConflict, got.status, got.body)
			again := s.post("/v1/charges", "k1", "acme", `{}`)
			require.Equal(t, got.body, again.body)
			require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader))
		})
	}
}

// TestHandlerThatRestartsItsTransactionFailsTheKey: a handler ends its
// transaction and leaves another open in its place (COMMIT AND CHAIN in a
// string of statements, seen before the commit; or on the simple protocol
// with arguments, seen only by the commit's check of the transaction's
// mark). Its first write is committed without the response, so running it
// again would write twice: the key fails for good, with a stored 500 every
// retry gets, and the handler runs once. The write after the restart is
// never committed.
//
// Before the fix, the response committed with the replacing transaction as
// if nothing happened, and a crash before it left a retry to write again.
func TestHandlerThatRestartsItsTransactionFailsTheKey(t *testing.T) {
	t.Parallel()
	sends := map[string]func(ctx context.Context, tx pgx.Tx) error{
		"seen before the commit": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO charges (body) VALUES ('a'); COMMIT AND CHAIN; INSERT INTO charges (body) VALUES ('b')`)
			return err
		},
		"seen at the commit": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO charges (body) VALUES ($1); COMMIT AND CHAIN; INSERT INTO charges (body) VALUES ('b')`,
				pgx.QueryExecModeSimpleProtocol, "a")
			return err
		},
	}
	for name, send := range sends {
		for _, atomic := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/atomic=%v", name, atomic), func(t *testing.T) {
				s := newServer(t, idemhttp.Config{Atomic: atomic})
				s.handle = func(w http.ResponseWriter, r *http.Request) {
					tx, err := idemhttp.Tx(r.Context())
					if err == nil {
						err = send(r.Context(), tx)
					}
					if err != nil {
						http.Error(w, err.Error(), 500)
						return
					}
					w.WriteHeader(http.StatusCreated)
				}
				first := s.post("/v1/charges", "k1", "acme", `{"amount": 100}`)
				require.Equal(t, http.StatusInternalServerError, first.status, first.body)
				again := s.post("/v1/charges", "k1", "acme", `{"amount": 100}`)
				require.Equal(t, http.StatusInternalServerError, again.status, again.body)
				require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader))
				require.Equal(t, first.body, again.body)
				require.EqualValues(t, 1, s.runs.Load())
				var bodies []string
				rows, err := s.db.Query(context.Background(), `SELECT body FROM charges ORDER BY id`)
				require.NoError(t, err)
				bodies, err = pgx.CollectRows(rows, pgx.RowTo[string])
				require.NoError(t, err)
				require.Equal(t, []string{"a"}, bodies, "the write the handler's own COMMIT committed, and nothing after it")
			})
		}
	}
}
