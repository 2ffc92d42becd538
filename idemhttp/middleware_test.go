package idemhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// trustedTenant reads the tenant from X-Tenant-ID, as the tests' servers
// trust their clients to say it.
var trustedTenant = idemhttp.TenantFromTrustedHeader("X-Tenant-ID")

// server is a real HTTP server whose POST /v1/charges handler is behind the
// middleware and writes a row in the middleware's transaction.
type server struct {
	t      *testing.T
	db     *pgxpool.Pool
	url    string
	runs   atomic.Int32
	handle func(w http.ResponseWriter, r *http.Request) // the handler's behaviour; set before requests
}

func newServer(t *testing.T, cfg idemhttp.Config) *server {
	t.Helper()
	t.Parallel()
	return newServerOn(t, dbtest.NewPool(t, 16), cfg, nil)
}

// newServerOn is newServer on pool, with the middleware's database wrapped
// by wrap when it is not nil. Without cfg.Tenant, the tenant is
// trustedTenant's.
func newServerOn(t *testing.T, pool *pgxpool.Pool, cfg idemhttp.Config, wrap func(*pgxpool.Pool) workflow.DB) *server {
	t.Helper()
	if cfg.Tenant == nil {
		cfg.Tenant = trustedTenant
	}
	s := &server{t: t, db: pool}
	_, err := s.db.Exec(context.Background(), `CREATE TABLE charges (id bigserial PRIMARY KEY, body text)`)
	require.NoError(t, err)
	s.handle = s.charge
	var db workflow.DB = pool
	if wrap != nil {
		db = wrap(pool)
	}
	mw, err := idemhttp.Middleware(db, cfg)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.runs.Add(1)
		s.handle(w, r)
	})))
	mux.Handle("POST /v1/refunds", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.runs.Add(1)
		s.handle(w, r)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// charge writes a row in the middleware's transaction and answers 201.
func (s *server) charge(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	tx, err := idemhttp.Tx(r.Context())
	if err != nil {
		http.Error(w, err.Error(), 500)
		return
	}
	var id int64
	if err := tx.QueryRow(r.Context(), `INSERT INTO charges (body) VALUES ($1) RETURNING id`, string(body)).Scan(&id); err != nil {
		http.Error(w, err.Error(), 500)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Set-Cookie", "session=1")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"charge": %d,  "amount": 100}`, id)
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (s *server) post(path, key, tenant, body string) reply {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.url+path, strings.NewReader(body))
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if tenant != "" {
		req.Header.Set("X-Tenant-ID", tenant)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func (s *server) rows() int {
	s.t.Helper()
	var n int
	require.NoError(s.t, s.db.QueryRow(context.Background(), `SELECT count(*) FROM charges`).Scan(&n))
	return n
}

func problemOf(t *testing.T, r reply) string {
	t.Helper()
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), r.body)
	var p struct {
		Status int
		Detail string
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &p))
	require.Equal(t, r.status, p.Status)
	return p.Detail
}

func TestStoresAndReplays(t *testing.T) {
	s := newServer(t, idemhttp.Config{})
	first := s.post("/v1/charges", "k1", "acme", `{"amount": 100, "currency": "usd"}`)
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, `{"charge": 1,  "amount": 100}`, first.body)
	require.Empty(t, first.header.Get(idemhttp.ReplayedHeader))
	require.Equal(t, "session=1", first.header.Get("Set-Cookie"), "the first answer is the handler's, whole")

	// A bare key, an RFC 8941 string, with parameters.
	for _, key := range []string{"k1", `"k1"`, `"k1";v=2`, `"k1";a;b=?1;c="x;y";d=:aGk=:;e=-1.5;f=tok/en`} {
		again := s.post("/v1/charges", key, "acme", "{\n  \"currency\": \"usd\",\n  \"amount\": 1e2\n}")
		require.Equal(t, http.StatusCreated, again.status)
		require.Equal(t, first.body, again.body, "byte for byte")
		require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader))
		require.Equal(t, "application/json", again.header.Get("Content-Type"))
		require.Empty(t, again.header.Get("Set-Cookie"), "only allow-listed headers are replayed")
	}
	require.EqualValues(t, 1, s.runs.Load())
	require.Equal(t, 1, s.rows())

	other := s.post("/v1/charges", "k1", "globex", `{"amount": 100, "currency": "usd"}`)
	require.Equal(t, http.StatusCreated, other.status, "another tenant's key is another record")
	require.Equal(t, `{"charge": 2,  "amount": 100}`, other.body)
}

// TestReplayKeepsHeaderBytes: a header value is bytes, not text: a
// Latin-1 filename in Content-Disposition, which a JSON string in jsonb
// would have carried as U+FFFD, is replayed as the handler sent it, with
// the claim committed on its own and with Atomic.
func TestReplayKeepsHeaderBytes(t *testing.T) {
	t.Parallel()
	const disposition = "attachment; filename=\"caf\xe9.pdf\""
	for name, cfg := range map[string]idemhttp.Config{"default": {}, "atomic": {Atomic: true}} {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, cfg)
			s.handle = func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Disposition", disposition)
				s.charge(w, r)
			}
			first := s.post("/v1/charges", "k1", "acme", `{}`)
			require.Equal(t, http.StatusCreated, first.status, first.body)
			require.Equal(t, []string{disposition}, first.header.Values("Content-Disposition"))
			replay := s.post("/v1/charges", "k1", "acme", `{}`)
			require.Equal(t, "true", replay.header.Get(idemhttp.ReplayedHeader))
			require.Equal(t, []string{disposition}, replay.header.Values("Content-Disposition"), "byte for byte")
			require.Equal(t, first.body, replay.body)
			require.EqualValues(t, 1, s.runs.Load())
		})
	}
}

func TestRejectsBadRequestsWithoutRunning(t *testing.T) {
	s := newServer(t, idemhttp.Config{MaxBody: 64})
	cases := []struct {
		name, key, tenant, body string
		status                  int
		detail                  string
	}{
		{"missing key", "", "acme", `{}`, 400, "missing"},
		{"empty key", `""`, "acme", `{}`, 400, "required"},
		{"long key", strings.Repeat("k", 256), "acme", `{}`, 400, "longer than 255"},
		{"unprintable key", "a\tb", "acme", `{}`, 400, "visible ASCII only"},
		{"space in a bare key", "a b", "acme", `{}`, 400, "visible ASCII only"},
		{"merged headers", "a, b", "acme", `{}`, 400, "visible ASCII only"},
		{"non-ASCII bare key", "ключ", "acme", `{}`, 400, "visible ASCII only"},
		{"quote in a bare key", `abc"`, "acme", `{}`, 400, "visible ASCII only"},
		{"unprintable quoted key", "\"a\tb\"", "acme", `{}`, 400, "printable ASCII only"},
		{"bad quoting", `"a\b"`, "acme", `{}`, 400, "escape"},
		{"unterminated quoting", `"ab`, "acme", `{}`, 400, "closing quote"},
		{"missing tenant", "k", "", `{}`, 401, "X-Tenant-ID header is missing"},
		{"tenant list", "k", "acme, globex", `{}`, 400, "more than one value"},
		{"key list", `"a";x, "b"`, "acme", `{}`, 400, "one item"},
		{"bad parameter", `"a";X=1`, "acme", `{}`, 400, "no valid name"},
		{"body too large", "k", "acme", `{"pad":"` + strings.Repeat("x", 100) + `"}`, 413, "larger than 64 bytes"},
	}
	for _, tc := range cases {
		r := s.post("/v1/charges", tc.key, tc.tenant, tc.body)
		require.Equal(t, tc.status, r.status, tc.name)
		require.Contains(t, problemOf(t, r), tc.detail, tc.name)
	}
	require.Zero(t, s.runs.Load(), "the handler never ran")
	var keys int
	require.NoError(t, s.db.QueryRow(context.Background(), `SELECT count(*) FROM onceflow_keys`).Scan(&keys))
	require.Zero(t, keys, "nothing stored for rejected input")
}

func TestKeyOptionalPassesThrough(t *testing.T) {
	s := newServer(t, idemhttp.Config{KeyOptional: true})
	for range 2 {
		require.Equal(t, http.StatusCreated, s.post("/v1/charges", "", "acme", `{}`).status)
	}
	require.EqualValues(t, 2, s.runs.Load(), "unprotected: each request runs")
	require.Equal(t, 400, s.post("/v1/charges", `"bad`, "acme", `{}`).status, "a malformed key is still refused")
}

func TestMismatch(t *testing.T) {
	s := newServer(t, idemhttp.Config{})
	require.Equal(t, 201, s.post("/v1/charges", "k1", "acme", `{"amount":100}`).status)
	r := s.post("/v1/charges", "k1", "acme", `{"amount":101}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status)
	require.Contains(t, problemOf(t, r), "different request")
	r = s.post("/v1/refunds", "k1", "acme", `{"amount":100}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status, "the route is part of the fingerprint")
	require.EqualValues(t, 1, s.runs.Load())
}

func TestInFlightIsConflictWithRetryAfter(t *testing.T) {
	s := newServer(t, idemhttp.Config{})
	entered, release := make(chan struct{}), make(chan struct{})
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		s.charge(w, r)
	}
	done := make(chan reply, 1)
	go func() { done <- s.post("/v1/charges", "k1", "acme", `{}`) }()
	<-entered
	r := s.post("/v1/charges", "k1", "acme", `{}`)
	require.Equal(t, http.StatusConflict, r.status)
	require.Contains(t, problemOf(t, r), "in progress")
	require.Equal(t, "30", r.header.Get("Retry-After"))
	close(release)
	require.Equal(t, 201, (<-done).status)
}

func TestServerErrorsAndPanicsAreNotStored(t *testing.T) {
	s := newServer(t, idemhttp.Config{})
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemhttp.Tx(r.Context())
		_, _ = tx.Exec(r.Context(), `INSERT INTO charges (body) VALUES ('doomed')`)
		http.Error(w, "ledger down", http.StatusBadGateway)
	}
	r := s.post("/v1/charges", "k1", "acme", `{}`)
	require.Equal(t, http.StatusBadGateway, r.status)
	require.Zero(t, s.rows(), "the handler's writes rolled back")

	s.handle = func(http.ResponseWriter, *http.Request) { panic("nil map") }
	r = s.post("/v1/charges", "k1", "acme", `{}`)
	require.Equal(t, http.StatusInternalServerError, r.status)
	problemOf(t, r)

	s.handle = s.charge
	require.Equal(t, 201, s.post("/v1/charges", "k1", "acme", `{}`).status, "the key was free again")
	require.EqualValues(t, 3, s.runs.Load())
	require.Equal(t, 1, s.rows())
}

func TestStorageUnreachableFailsClosed(t *testing.T) {
	t.Parallel()
	db := dbtest.NewPool(t, 2)
	mw, err := idemhttp.Middleware(db, idemhttp.Config{Tenant: trustedTenant})
	require.NoError(t, err)
	var ran atomic.Bool
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran.Store(true) })))
	defer srv.Close()
	db.Close() // the database is gone
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/x", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k1")
	req.Header.Set("X-Tenant-ID", "acme")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, string(body))
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	require.False(t, ran.Load(), "the handler is not run without the key's protection")
}

// TestTakenOverHandlerIsFencedOut: a handler outlives its lease, another
// request takes the key over and answers; the slow one's writes roll back.
func TestTakenOverHandlerIsFencedOut(t *testing.T) {
	s := newServer(t, idemhttp.Config{})
	entered, release := make(chan struct{}), make(chan struct{})
	var slow atomic.Bool
	slow.Store(true)
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		if slow.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
		s.charge(w, r)
	}
	done := make(chan reply, 1)
	go func() { done <- s.post("/v1/charges", "k1", "acme", `{}`) }()
	<-entered
	store, err := recovery.New(s.db, recovery.Config{})
	require.NoError(t, err)
	require.NoError(t, store.ExpireLease(context.Background(), recovery.Key{Tenant: "acme", ID: "k1"}))
	winner := s.post("/v1/charges", "k1", "acme", `{}`)
	require.Equal(t, 201, winner.status)

	close(release)
	late := <-done
	require.Equal(t, http.StatusConflict, late.status)
	require.Contains(t, problemOf(t, late), "took this request over")
	require.Equal(t, 1, s.rows(), "the slow handler's row rolled back")
	replay := s.post("/v1/charges", "k1", "acme", `{}`)
	require.Equal(t, winner.body, replay.body)
}

func TestTxOutsideMiddleware(t *testing.T) {
	t.Parallel()
	_, err := idemhttp.Tx(context.Background())
	require.True(t, errors.Is(err, idemhttp.ErrNoTransaction))
	_, err = idemhttp.Middleware(nil, idemhttp.Config{Tenant: trustedTenant, MaxBody: -1})
	require.Error(t, err)
	_, err = idemhttp.Middleware(nil, idemhttp.Config{})
	require.ErrorIs(t, err, idemhttp.ErrNoTenant, "the tenant has no default")
}

// TestPathAndQueryAreFingerprinted: one route pattern names many
// resources; a key reused for another one is a mismatch, not its replay.
func TestPathAndQueryAreFingerprinted(t *testing.T) {
	t.Parallel()
	db := dbtest.NewPool(t, 4)
	mw, err := idemhttp.Middleware(db, idemhttp.Config{Tenant: trustedTenant})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders/{id}/refund", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "refunded order %s amount %s", r.PathValue("id"), r.URL.Query().Get("amount"))
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	s := &server{t: t, db: db, url: srv.URL}
	require.Equal(t, 200, s.post("/v1/orders/1/refund?amount=5", "k", "acme", "").status)
	require.Equal(t, http.StatusUnprocessableEntity, s.post("/v1/orders/2/refund?amount=5", "k", "acme", "").status)
	require.Equal(t, http.StatusUnprocessableEntity, s.post("/v1/orders/1/refund?amount=500", "k", "acme", "").status)
	again := s.post("/v1/orders/1/refund?amount=5", "k", "acme", "")
	require.Equal(t, "refunded order 1 amount 5", again.body)
	require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader))
}

func TestInformationalStatusIsNotStored(t *testing.T) {
	s := newServer(t, idemhttp.Config{})
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "made")
	}
	first := s.post("/v1/charges", "k1", "acme", `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, http.StatusCreated, s.post("/v1/charges", "k1", "acme", `{}`).status)
}

// TestAbortedHandlerReleasesEverything: panic(http.ErrAbortHandler) drops
// the client's connection; the middleware still rolls back, hands its
// database connection back and frees the key.
func TestAbortedHandlerReleasesEverything(t *testing.T) {
	s := newServer(t, idemhttp.Config{})
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemhttp.Tx(r.Context())
		_, _ = tx.Exec(r.Context(), `INSERT INTO charges (body) VALUES ('aborted')`)
		panic(http.ErrAbortHandler)
	}
	for range 3 {
		req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/charges", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k1")
		req.Header.Set("X-Tenant-ID", "acme")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		require.Error(t, err, "the connection was dropped")
	}
	require.Zero(t, s.db.Stat().AcquiredConns(), "no database connection left behind")
	require.Zero(t, s.rows())
	s.handle = s.charge
	require.Equal(t, 201, s.post("/v1/charges", "k1", "acme", `{}`).status, "the key is free")
}

// TestTxAfterTheHandlerReturned: a goroutine the handler left behind gets
// an error, not a transaction nobody ends.
func TestTxAfterTheHandlerReturned(t *testing.T) {
	s := newServer(t, idemhttp.Config{})
	late := make(chan error, 1)
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		ctx := context.WithoutCancel(r.Context())
		go func() {
			for { // until the handler has returned and the transaction is over
				runtime.Gosched()
				if _, err := idemhttp.Tx(ctx); err != nil {
					late <- err
					return
				}
			}
		}()
		w.WriteHeader(http.StatusCreated)
	}
	require.Equal(t, 201, s.post("/v1/charges", "k1", "acme", `{}`).status)
	require.Error(t, <-late)
	require.Eventually(t, func() bool { return s.db.Stat().AcquiredConns() == 0 }, 5*time.Second, 10*time.Millisecond)
}

// TestClientGoneAfterTheHandler: the handler's work is stored even when
// its client gave up waiting; the retry gets the replay.
func TestClientGoneAfterTheHandler(t *testing.T) {
	s := newServer(t, idemhttp.Config{})
	release := make(chan struct{})
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // the client is gone
		close(release)
		s.charge(w, r.WithContext(context.WithoutCancel(r.Context())))
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/charges", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k1")
	req.Header.Set("X-Tenant-ID", "acme")
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return s.runs.Load() == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	<-release
	s.handle = func(http.ResponseWriter, *http.Request) { t.Error("the handler ran again") }
	var replay reply
	require.Eventually(t, func() bool {
		replay = s.post("/v1/charges", "k1", "acme", `{}`)
		return replay.status != http.StatusConflict
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, http.StatusCreated, replay.status)
	require.Equal(t, "true", replay.header.Get(idemhttp.ReplayedHeader))
	require.Equal(t, 1, s.rows())
}

// TestLongHandlerKeepsItsLease: a handler that runs past a third of its
// lease has the lease renewed, so a duplicate meanwhile is still 409. The
// lease is long enough that renewals a third of it apart come in time on a
// loaded machine; the test lasts about a third of it.
func TestLongHandlerKeepsItsLease(t *testing.T) {
	const lease = 2 * time.Second
	s := newServer(t, idemhttp.Config{Lease: lease})
	release := make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	defer free() // a failed check must not leave the server waiting on the handler
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		<-release
		s.charge(w, r)
	}
	done := make(chan reply, 1)
	go func() { done <- s.post("/v1/charges", "k1", "acme", `{}`) }()
	store, err := recovery.New(s.db, recovery.Config{})
	require.NoError(t, err)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	require.Eventually(t, func() bool { // renewed: the claim alone ends a lease after it was made
		rec, err := store.Load(context.Background(), key)
		return err == nil && rec.LockedUntil.Sub(rec.CreatedAt) > lease+lease/6
	}, 10*lease, 10*time.Millisecond)
	require.Equal(t, http.StatusConflict, s.post("/v1/charges", "k1", "acme", `{}`).status)
	free()
	require.Equal(t, http.StatusCreated, (<-done).status)
}
