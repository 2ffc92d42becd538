package idemclient

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// charges is a real idemhttp.Middleware on a real PostgreSQL, in front of
// a handler that writes a charge in the middleware's transaction. A body
// saying "flaky" fails its key's first run with 503 (not stored: the
// retry runs the handler again); one saying "slow" waits for release; one
// saying "taken" is refused with a 409 of the handler's own, which the
// middleware stores like any business answer.
type charges struct {
	db      *pgxpool.Pool
	url     string
	entered chan struct{}
	release chan struct{}
	let     sync.Once // closes release, for tests that also release it on cleanup

	mu   sync.Mutex
	runs map[string]int
}

func newCharges(t *testing.T) *charges {
	t.Helper()
	return newChargesWith(t, idemhttp.Config{}, nil)
}

// newChargesWith is newCharges with the middleware configured by cfg (its
// Tenant is set), and arrived, when set, told of each request as it comes
// in, before the middleware.
func newChargesWith(t *testing.T, cfg idemhttp.Config, arrived func(*http.Request)) *charges {
	t.Helper()
	return newChargesOn(t, dbtest.NewPool(t, 8), cfg, arrived)
}

// newChargesOn is newChargesWith on db.
func newChargesOn(t *testing.T, db *pgxpool.Pool, cfg idemhttp.Config, arrived func(*http.Request)) *charges {
	t.Helper()
	s := &charges{db: db, entered: make(chan struct{}, 1), release: make(chan struct{}), runs: map[string]int{}}
	_, err := s.db.Exec(context.Background(), `CREATE TABLE charges (id bigserial PRIMARY KEY, key text NOT NULL, body text NOT NULL)`)
	require.NoError(t, err)
	cfg.Tenant = func(*http.Request) (string, error) { return "acme", nil }
	mw, err := idemhttp.Middleware(s.db, cfg)
	require.NoError(t, err)
	h := mw(http.HandlerFunc(s.charge))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if arrived != nil {
			arrived(r)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *charges) charge(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(KeyHeader)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.runs[key]++
	n := s.runs[key]
	s.mu.Unlock()
	switch {
	case strings.Contains(string(body), "flaky") && n == 1:
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	case strings.Contains(string(body), "slow"):
		s.entered <- struct{}{}
		<-s.release
	case strings.Contains(string(body), "taken"):
		http.Error(w, "that name is taken", http.StatusConflict)
		return
	}
	tx, err := idemhttp.Tx(r.Context())
	var id int64
	if err == nil {
		err = tx.QueryRow(r.Context(), `INSERT INTO charges (key, body) VALUES ($1, $2) RETURNING id`, key, string(body)).Scan(&id)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"charge":%d}`, id)
}

// chargesByKey counts the charges written under each key.
func (s *charges) chargesByKey(t *testing.T) map[string]int {
	t.Helper()
	rows, err := s.db.Query(context.Background(), `SELECT key, count(*) FROM charges GROUP BY key`)
	require.NoError(t, err)
	defer rows.Close()
	got := map[string]int{}
	for rows.Next() {
		var key string
		var n int
		require.NoError(t, rows.Scan(&key, &n))
		got[key] = n
	}
	require.NoError(t, rows.Err())
	return got
}

// withKey sets req's key, unless it is "", and a JSON media type.
func withKey(req *http.Request, key string) *http.Request {
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(KeyHeader, key)
	}
	return req
}

// send posts body through c and returns the response with its body read.
func send(t *testing.T, c *Client, url, key, body string) (*Response, string) {
	t.Helper()
	resp, err := c.Do(context.Background(), withKey(post(t, url, body), key))
	require.NoError(t, err)
	defer func() { require.NoError(t, resp.Body.Close()) }()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(got)
}

func TestAgainstTheMiddleware(t *testing.T) {
	t.Parallel()
	s := newCharges(t)
	c, _ := newClient(t, Config{})

	const intents = 5
	type exchange struct{ request, answer string }
	sent := map[string]exchange{}
	for i := range intents {
		request := fmt.Sprintf(`{"flaky":true,"intent":%d}`, i)
		resp, answer := send(t, c, s.url, "", request)
		require.Equal(t, http.StatusCreated, resp.StatusCode, answer)
		require.Equal(t, 2, resp.Attempts, "the first run's 503 is retried")
		require.False(t, resp.Replayed)
		sent[resp.Key] = exchange{request, answer}
	}
	byKey := s.chargesByKey(t)
	require.Len(t, byKey, intents, "one key per intent")
	for key := range sent {
		require.Equal(t, 1, byKey[key], "one charge per intent")
	}

	// A process that kept its key and sends the intent again is answered
	// from the record: nothing runs again.
	for key, x := range sent {
		resp, answer := send(t, c, s.url, key, x.request)
		require.True(t, resp.Replayed)
		require.Equal(t, 1, resp.Attempts)
		require.Equal(t, x.answer, answer)
	}
	require.Equal(t, byKey, s.chargesByKey(t))
}

func TestAgainstTheMiddlewareInFlight(t *testing.T) {
	t.Parallel()
	s := newCharges(t)
	key := NewKey()
	const body = `{"slow":true}`

	first := make(chan string, 1)
	c1, _ := newClient(t, Config{Wait: -1})
	go func() {
		defer close(first)
		resp, err := c1.Do(context.Background(), withKey(post(t, s.url, body), key))
		if err != nil {
			t.Error(err)
			return
		}
		defer func() { _ = resp.Body.Close() }()
		got, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Error(err)
		}
		first <- string(got)
	}()
	<-s.entered

	// The duplicate finds the key in flight (409 with Retry-After); before
	// its retry, the first request finishes.
	var firstBody string
	var waits []WaitInfo
	c, _ := newClient(t, Config{Wait: -1, Hooks: Hooks{Wait: func(w WaitInfo) {
		waits = append(waits, w)
		if len(waits) == 1 {
			close(s.release)
			firstBody = <-first
		}
	}}})
	resp, got := send(t, c, s.url, key, body)
	require.Len(t, waits, 1)
	require.Equal(t, http.StatusConflict, waits[0].Status)
	require.Positive(t, waits[0].RetryAfter, "the middleware says when to come back")
	require.GreaterOrEqual(t, waits[0].Delay, waits[0].RetryAfter)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.True(t, resp.Replayed)
	require.Equal(t, 2, resp.Attempts)
	require.Equal(t, firstBody, got, "the duplicate gets the first request's answer")
	require.Equal(t, map[string]int{key: 1}, s.chargesByKey(t))
}

// TestAStoredAnswerIsFinal: a retryable status that the server replays
// from its record (a handler's own 409, a workflow's stored 500) is the
// key's answer for good: the client returns it, as Replayed, instead of
// asking again until its attempts or its budget run out.
//
// Mutation caught: a replayed answer treated by its status alone (10
// attempts, then ErrAttemptsExhausted, and the budget spent).
func TestAStoredAnswerIsFinal(t *testing.T) {
	t.Parallel()
	s := newCharges(t)
	c, clk := newClient(t, Config{})
	resp, got := send(t, c, s.url, "", `{"taken":true}`)
	require.Equal(t, http.StatusConflict, resp.StatusCode, got)
	require.True(t, resp.Replayed)
	require.Equal(t, 2, resp.Attempts, "the first answer's 409 is retried once; its replay is final")
	require.Len(t, clk.sleeps(), 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Equal(t, map[string]int{resp.Key: 1}, s.runs)
}

// TestExpiryOfAReplayFromASkewedDatabase: the client reads a key's
// expiry against the answer's Date; the server's pruner forgets the key
// by its database's clock. Behind a middleware whose database's clock is
// an hour ahead, the expiry the client reads from a replay is still no
// later than the moment the pruner may forget the key: the client never
// takes a retry the server would run as a new request for one within the
// key's lifetime.
//
// Mutation caught: the middleware's replay expiry taken from the
// record's completion as the database's clock read it
// (replay-expiry-database-clock).
func TestExpiryOfAReplayFromASkewedDatabase(t *testing.T) {
	t.Parallel()
	const lifetime = 10 * time.Minute
	db := dbtest.Connect(t, dbtest.NewSkewedDatabase(t, time.Hour, dbtest.Options{}), 8)
	s := newChargesOn(t, db, idemhttp.Config{KeyLifetime: lifetime}, nil)
	c, _ := newClient(t, Config{})
	key := NewKey()
	first, _ := send(t, c, s.url, key, `{}`)
	require.Equal(t, http.StatusCreated, first.StatusCode)

	sent := time.Now() // the client's clock, read no later than the server's Date
	replay, _ := send(t, c, s.url, key, `{}`)
	require.True(t, replay.Replayed)
	at, ok := expiry(replay.Header, sent)
	require.True(t, ok, "the replay advertises the key's lifetime")

	var leftMicros int64
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT (extract(epoch FROM completed_at + $2::bigint * interval '1 microsecond' - clock_timestamp()) * 1e6)::bigint
		 FROM onceflow_keys WHERE key = $1`, key, lifetime.Microseconds()).Scan(&leftMicros))
	kept := time.Now().Add(time.Duration(leftMicros) * time.Microsecond)
	require.False(t, at.After(kept), "the client reads an expiry of %s; the pruner may forget the key at %s", at, kept)
}
