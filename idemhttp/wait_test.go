package idemhttp_test

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/workflow"
)

// polls watches a server's waiting requests (Prefer: wait): it counts the
// claims that found a key in flight and, at the second, notes the
// connections the pool has lent out.
type polls struct {
	pool     *pgxpool.Pool // set before any request
	n        atomic.Int32
	acquired atomic.Int32  // the pool's lent connections at the second poll
	first    chan struct{} // closed at the first poll
	second   chan struct{} // closed at the second poll
}

func newPolls() *polls { return &polls{first: make(chan struct{}), second: make(chan struct{})} }

// polled is the hook: a waiting request calls it between its claims.
func (p *polls) polled() {
	switch p.n.Add(1) {
	case 1:
		close(p.first)
	case 2:
		p.acquired.Store(p.pool.Stat().AcquiredConns())
		close(p.second)
	}
}

// preferring is the headers of a JSON request of tenant acme with key,
// preferring prefer (none when "").
func preferring(key, prefer string) http.Header {
	h := http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {key}, "X-Tenant-ID": {"acme"}}
	if prefer != "" {
		h.Set("Prefer", prefer)
	}
	return h
}

// holdFirst makes s's first run wait for release, closing entered first;
// the later ones charge at once. release is called at the test's end, at
// the latest, before the server closes.
func holdFirst(t *testing.T, s *server) (entered chan struct{}, release func()) {
	entered, held := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(held) }) }
	t.Cleanup(release)
	var first sync.Once
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		first.Do(func() {
			close(entered)
			<-held
		})
		s.charge(w, r)
	}
	return entered, release
}

// awaitPoll waits for signal, failing when the waiting request answers
// first.
func awaitPoll(t *testing.T, signal <-chan struct{}, answered <-chan reply) {
	t.Helper()
	select {
	case <-signal:
	case r := <-answered:
		t.Fatalf("the request answered without waiting: %d %s", r.status, r.body)
	}
}

// expiresOf parses r's Idempotency-Key-Expires, an IMF-fixdate.
func expiresOf(t *testing.T, r reply) time.Time {
	t.Helper()
	value := r.header.Get(idemhttp.ExpiresHeader)
	at, err := http.ParseTime(value)
	require.NoError(t, err, "%s: %q", idemhttp.ExpiresHeader, value)
	require.Equal(t, at.UTC().Format(http.TimeFormat), value, "an IMF-fixdate")
	return at
}

// requireExpiresAround checks that r advertises the key lifetime after a
// moment between before and after (now, while the record finishes later).
func requireExpiresAround(t *testing.T, r reply, before, after time.Time, lifetime time.Duration) {
	t.Helper()
	at := expiresOf(t, r)
	require.False(t, at.Before(before.Add(lifetime).Truncate(time.Second)), "%s is before %s", at, before.Add(lifetime))
	require.False(t, at.After(after.Add(lifetime)), "%s is after %s", at, after.Add(lifetime))
}

// requireReplayExpires checks that r, a replay answered within took,
// advertises the key lifetime after completed, the record's completion
// (on the database's clock, which is this machine's here), placed on the
// process's clock: by how long ago the record finished when the claim
// read it, counted from a moment before that read, so no later than
// completed and no earlier than took before it.
func requireReplayExpires(t *testing.T, r reply, completed time.Time, took, lifetime time.Duration) {
	t.Helper()
	requireExpiresAround(t, r, completed.Add(-took), completed, lifetime)
}

// backdate moves the completion of key's record an hour back, so that a
// replay's expiry differs from now's, and returns it.
func backdate(t *testing.T, db *pgxpool.Pool, key string) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, db.QueryRow(context.Background(),
		`UPDATE onceflow_keys SET completed_at = completed_at - interval '1 hour' WHERE key = $1 RETURNING completed_at`, key).Scan(&at))
	return at
}

// TestPreferWaitGetsTheStoredAnswer: a duplicate that arrives while the
// first request's handler runs, preferring to wait, polls without holding
// a connection and gets the stored answer once the first finishes, as a
// replay; Prefer is not fingerprinted.
//
// Mutations caught: Prefer ignored (409 at once); a connection held while
// waiting (acquired 1); Prefer in the fingerprint (422).
func TestPreferWaitGetsTheStoredAnswer(t *testing.T) {
	t.Parallel()
	p := newPolls()
	p.pool = dbtest.NewPool(t, 16)
	s := newServerOn(t, p.pool, idemhttp.WithPolled(idemhttp.Config{Lease: time.Hour}, p.polled), nil)
	entered, release := holdFirst(t, s)
	first := make(chan reply, 1)
	go func() { first <- s.send("POST", "/v1/charges", preferring("k1", ""), `{"amount": 1}`) }()
	<-entered
	waited := make(chan reply, 1)
	go func() { waited <- s.send("POST", "/v1/charges", preferring("k1", "wait=5"), `{"amount": 1}`) }()
	awaitPoll(t, p.second, waited)
	require.Zero(t, p.acquired.Load(), "a waiting request holds no connection between its claims")

	release()
	created := <-first
	require.Equal(t, http.StatusCreated, created.status, created.body)
	require.Empty(t, created.header.Get(idemhttp.PreferenceAppliedHeader))
	r := <-waited
	require.Equal(t, http.StatusCreated, r.status, r.body)
	require.Equal(t, created.body, r.body)
	require.Equal(t, "true", r.header.Get(idemhttp.ReplayedHeader))
	require.Equal(t, "wait=5", r.header.Get(idemhttp.PreferenceAppliedHeader))
	require.EqualValues(t, 1, s.runs.Load())
}

// TestPreferWaitPastItsBoundIs409: a request whose key stays in flight
// longer than it prefers to wait gets the usual 409, saying that it waited;
// one that does not prefer to wait, or prefers no wait, gets it at once.
//
// Mutations caught: Prefer ignored (no Preference-Applied); a wait without
// Prefer, or for wait=0 (polls counted).
func TestPreferWaitPastItsBoundIs409(t *testing.T) {
	p := newPolls()
	s := newServer(t, idemhttp.WithPolled(idemhttp.Config{}, p.polled))
	p.pool = s.db
	entered, release := holdFirst(t, s)
	first := make(chan reply, 1)
	go func() { first <- s.send("POST", "/v1/charges", preferring("k1", ""), `{}`) }()
	<-entered

	for _, prefer := range []string{"", "wait=0", "wait=soon", "respond-async"} {
		before := time.Now()
		r := s.send("POST", "/v1/charges", preferring("k1", prefer), `{}`)
		require.Equal(t, http.StatusConflict, r.status, prefer)
		require.NotEmpty(t, r.header.Get("Retry-After"), prefer)
		require.Empty(t, r.header.Get(idemhttp.PreferenceAppliedHeader), prefer)
		requireExpiresAround(t, r, before, time.Now(), recovery24h)
	}
	require.Zero(t, p.n.Load(), "no request waited")

	r := s.send("POST", "/v1/charges", preferring("k1", "respond-async, WAIT=1"), `{}`)
	require.Equal(t, http.StatusConflict, r.status, r.body)
	require.Contains(t, problemOf(t, r), "in progress")
	require.NotEmpty(t, r.header.Get("Retry-After"))
	require.Equal(t, "wait=1", r.header.Get(idemhttp.PreferenceAppliedHeader))
	require.NotZero(t, p.n.Load(), "it polled")
	expiresOf(t, r)

	release()
	require.Equal(t, http.StatusCreated, (<-first).status)
	require.EqualValues(t, 1, s.runs.Load())
}

// recovery24h is recovery.RetentionDefault, the default key lifetime.
const recovery24h = 24 * time.Hour

// TestPreferWaitersAreBounded: past MaxWaiters, a request that prefers to
// wait answers 409 at once, while the one waiting still gets its replay.
//
// Mutation caught: MaxWaiters ignored (the second waits: Preference-Applied).
func TestPreferWaitersAreBounded(t *testing.T) {
	p := newPolls()
	s := newServer(t, idemhttp.WithPolled(idemhttp.Config{MaxWaiters: 1}, p.polled))
	p.pool = s.db
	entered, release := holdFirst(t, s)
	first := make(chan reply, 1)
	go func() { first <- s.send("POST", "/v1/charges", preferring("k1", ""), `{}`) }()
	<-entered
	waited := make(chan reply, 1)
	go func() { waited <- s.send("POST", "/v1/charges", preferring("k1", "wait=10"), `{}`) }()
	awaitPoll(t, p.first, waited)

	r := s.send("POST", "/v1/charges", preferring("k1", "wait=10"), `{}`)
	require.Equal(t, http.StatusConflict, r.status, r.body)
	require.Empty(t, r.header.Get(idemhttp.PreferenceAppliedHeader), "it did not wait")

	release()
	require.Equal(t, http.StatusCreated, (<-first).status)
	w := <-waited
	require.Equal(t, http.StatusCreated, w.status, w.body)
	require.Equal(t, "true", w.header.Get(idemhttp.ReplayedHeader))
	require.Equal(t, "wait=10", w.header.Get(idemhttp.PreferenceAppliedHeader))
}

// TestWorkflowPreferWait: the same through Workflow, with a step held: the
// waiting duplicate holds no connection and gets the replay; one that
// waits less than the step takes gets 409.
//
// Mutations caught: Prefer ignored by Workflow (409 at once); the wait
// holding a connection (acquired 1).
func TestWorkflowPreferWait(t *testing.T) {
	p := newPolls()
	s := newWorkflowServerOn(t, idemhttp.WorkflowWithPolled(idemhttp.WorkflowConfig{Tenant: trustedTenant}, p.polled),
		workflow.Config{Lease: time.Hour})
	p.pool = s.db
	g := gate{entered: make(chan struct{}), release: make(chan struct{})}
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(g.release) }) })
	s.block <- g
	first := make(chan reply, 1)
	go func() { first <- s.send("POST", "/v1/charges", preferring("k1", ""), `{"amount_cents": 500}`) }()
	<-g.entered
	waited := make(chan reply, 1)
	go func() { waited <- s.send("POST", "/v1/charges", preferring("k1", "wait=5"), `{"amount_cents": 500}`) }()
	awaitPoll(t, p.second, waited)
	require.Zero(t, p.acquired.Load(), "a waiting request holds no connection between its claims")

	once.Do(func() { close(g.release) })
	created := <-first
	require.Equal(t, http.StatusCreated, created.status, created.body)
	r := <-waited
	require.Equal(t, http.StatusCreated, r.status, r.body)
	require.Equal(t, created.body, r.body)
	require.Equal(t, "true", r.header.Get(idemhttp.ReplayedHeader))
	require.Equal(t, "wait=5", r.header.Get(idemhttp.PreferenceAppliedHeader))
	require.EqualValues(t, 1, s.runs.Load())

	// A step that outlasts the wait.
	g2 := gate{entered: make(chan struct{}), release: make(chan struct{})}
	var once2 sync.Once
	t.Cleanup(func() { once2.Do(func() { close(g2.release) }) })
	s.block <- g2
	go func() { first <- s.send("POST", "/v1/charges", preferring("k2", ""), `{"amount_cents": 500}`) }()
	<-g2.entered
	r = s.send("POST", "/v1/charges", preferring("k2", "wait=1"), `{"amount_cents": 500}`)
	require.Equal(t, http.StatusConflict, r.status, r.body)
	require.Equal(t, "wait=1", r.header.Get(idemhttp.PreferenceAppliedHeader))
	expiresOf(t, r)
	once2.Do(func() { close(g2.release) })
	require.Equal(t, http.StatusCreated, (<-first).status)
}

// TestKeyLifetimeIsAdvertised: every answer about a key with a record says
// when the key may be forgotten: the handler's own answer and a 409 the
// lifetime after now, a replay the lifetime after the record finished. Answers about no record of the caller's (400, 401, 403, 422)
// say nothing; the stored response never holds the header, even when the
// handler sets it and the allow-list names it.
//
// Mutations caught: a replay's expiry taken from now; the header stored
// (removed from recovery's never-stored list); the header on 403 or 422.
func TestKeyLifetimeIsAdvertised(t *testing.T) {
	const lifetime = 2 * time.Hour
	s := newServer(t, idemhttp.Config{Tenant: byToken(false), Principal: byToken(true), KeyLifetime: lifetime,
		ResponseHeaders: []string{"Content-Type", idemhttp.ExpiresHeader}})
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(idemhttp.ExpiresHeader, "Thu, 01 Jan 1970 00:00:00 GMT")
		s.charge(w, r)
	}
	before := time.Now()
	created := s.send("POST", "/v1/charges", as("tok-alice", "k1"), `{}`)
	require.Equal(t, http.StatusCreated, created.status, created.body)
	requireExpiresAround(t, created, before, time.Now(), lifetime)

	var stored bool
	require.NoError(t, s.db.QueryRow(context.Background(),
		`SELECT response_header::text ILIKE '%idempotency-key-expires%' FROM onceflow_keys WHERE key = 'k1'`).Scan(&stored))
	require.False(t, stored, "the stored response does not hold the header")

	completed := backdate(t, s.db, "k1")
	before = time.Now()
	replay := s.send("POST", "/v1/charges", as("tok-alice", "k1"), `{}`)
	require.Equal(t, "true", replay.header.Get(idemhttp.ReplayedHeader))
	requireReplayExpires(t, replay, completed, time.Since(before), lifetime)

	for name, r := range map[string]reply{
		"400": s.send("POST", "/v1/charges", as("tok-alice", `"k1`), `{}`),
		"401": s.send("POST", "/v1/charges", as("tok-forged", "k1"), `{}`),
		"403": s.send("POST", "/v1/charges", as("tok-bob", "k1"), `{}`),
		"422": s.send("POST", "/v1/charges", as("tok-alice", "k1"), `{"other": 1}`),
	} {
		require.Equal(t, name, strconv.Itoa(r.status), r.body)
		require.Empty(t, r.header.Get(idemhttp.ExpiresHeader), name)
	}
	require.EqualValues(t, 1, s.runs.Load())
}

// TestKeyLifetimeDefaultsAndOff: the default lifetime is the pruner's
// default retention; a negative one advertises nothing; a database that
// does not answer advertises nothing.
func TestKeyLifetimeDefaultsAndOff(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t, 4)
	byDefault := newServerOn(t, pool, idemhttp.Config{}, nil)
	before := time.Now()
	r := byDefault.post("/v1/charges", "k1", "acme", `{}`)
	require.Equal(t, http.StatusCreated, r.status, r.body)
	requireExpiresAround(t, r, before, time.Now(), recovery24h)

	off := newServerOn(t, dbtest.NewPool(t, 4), idemhttp.Config{KeyLifetime: -1}, nil)
	for range 2 {
		r := off.post("/v1/charges", "k2", "acme", `{}`)
		require.Equal(t, http.StatusCreated, r.status, r.body)
		require.Empty(t, r.header.Get(idemhttp.ExpiresHeader))
	}

	pool.Close()
	down := byDefault.post("/v1/charges", "k3", "acme", `{}`)
	require.Equal(t, http.StatusServiceUnavailable, down.status, down.body)
	require.Empty(t, down.header.Get(idemhttp.ExpiresHeader))
}

// TestWorkflowKeyLifetime: through Workflow, a replay's expiry is its
// record's completion plus the lifetime; a step that failed part-way (500)
// or deferred (503) leaves a record and says so; a mismatch does not.
//
// Mutations caught: a replay's expiry taken from now; no header on a
// failed step.
func TestWorkflowKeyLifetime(t *testing.T) {
	s := newWorkflowServer(t)
	s.failCharge.Store(1)
	before := time.Now()
	failed := s.post("/v1/charges", "k1", "acme", `{"amount_cents": 500}`)
	require.Equal(t, http.StatusInternalServerError, failed.status, failed.body)
	requireExpiresAround(t, failed, before, time.Now(), recovery24h)
	s.deferCharge.Store(int64(time.Minute))
	deferred := s.post("/v1/charges", "k1", "acme", `{"amount_cents": 500}`)
	require.Equal(t, http.StatusServiceUnavailable, deferred.status, deferred.body)
	expiresOf(t, deferred)
	_, err := s.db.Exec(context.Background(), `UPDATE onceflow_keys SET not_before = NULL`)
	require.NoError(t, err)
	created := s.post("/v1/charges", "k1", "acme", `{"amount_cents": 500}`)
	require.Equal(t, http.StatusCreated, created.status, created.body)
	expiresOf(t, created)

	completed := backdate(t, s.db, "k1")
	before = time.Now()
	replay := s.post("/v1/charges", "k1", "acme", `{"amount_cents": 500}`)
	require.Equal(t, "true", replay.header.Get(idemhttp.ReplayedHeader))
	requireReplayExpires(t, replay, completed, time.Since(before), recovery24h)

	mismatch := s.post("/v1/charges", "k1", "acme", `{"amount_cents": 501}`)
	require.Equal(t, http.StatusUnprocessableEntity, mismatch.status)
	require.Empty(t, mismatch.header.Get(idemhttp.ExpiresHeader))
}

// TestPreferredWait: the wait preference of RFC 7240, read robustly.
func TestPreferredWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		values []string
		want   time.Duration
	}{
		{nil, 0},
		{[]string{"wait=5"}, 5 * time.Second},
		{[]string{"WAIT=5"}, 5 * time.Second},
		{[]string{" Wait = 5 "}, 5 * time.Second},
		{[]string{`wait="3"`}, 3 * time.Second},
		{[]string{"respond-async, wait=5"}, 5 * time.Second},
		{[]string{"respond-async", "wait=7"}, 7 * time.Second},
		{[]string{"wait=5, wait=9"}, 5 * time.Second},
		{[]string{"wait=soon, wait=9"}, 0}, // only the first counts
		{[]string{"wait=5;foo=bar"}, 5 * time.Second},
		{[]string{`handling=lenient; x="a,wait=9", wait=4`}, 4 * time.Second},
		{[]string{`x="a\",wait=9", wait=2`}, 2 * time.Second},
		{[]string{"wait=0"}, 0},
		{[]string{"wait=-1"}, 0},
		{[]string{"wait=1.5"}, 0},
		{[]string{"wait=+1"}, 0},
		{[]string{"wait= 1 2"}, 0},
		{[]string{"waiting=5"}, 0},
		{[]string{"return=minimal"}, 0},
		{[]string{"wait"}, 0},
		{[]string{"wait="}, 0},
		{[]string{"=5"}, 0},
		{[]string{"", ","}, 0},
		{[]string{"\x00\xff,wait=\xff"}, 0},
		{[]string{`wait="`}, 0},
		{[]string{"wait=99999999999999999999999999999999"}, (1 << 30) * time.Second},
	} {
		require.Equal(t, tc.want, idemhttp.PreferredWait(tc.values), "%q", tc.values)
	}
}

// FuzzPreferredWait: any Prefer value reads as a wait between none and
// the cap, without panicking.
func FuzzPreferredWait(f *testing.F) {
	for _, seed := range []string{"wait=5", "respond-async, WAIT=10", `x="a,b", wait="3"`, "wait=99999999999999999999", `"`, `\`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		got := idemhttp.PreferredWait([]string{value})
		require.GreaterOrEqual(t, got, time.Duration(0))
		require.LessOrEqual(t, got, (1<<30)*time.Second)
	})
}
