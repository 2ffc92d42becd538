package idemclient

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeClock is a clock whose Sleep returns at once, moving the time on by
// what was asked: tests see every wait without waiting.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	slept []time.Duration
}

// epoch is where fake clocks start: a whole second, so that HTTP-dates
// (whole seconds) read back exactly.
var epoch = time.Date(2030, time.January, 2, 3, 4, 5, 0, time.UTC)

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	f.slept = append(f.slept, d)
	return nil
}

func (f *fakeClock) sleeps() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.slept...)
}

// newClient returns a Client on a fake clock that starts at epoch.
func newClient(t *testing.T, cfg Config) (*Client, *fakeClock) {
	t.Helper()
	c, err := New(cfg)
	require.NoError(t, err)
	clk := &fakeClock{now: epoch}
	c.clock = clk
	return c, clk
}

// seen is a request as a test server received it.
type seen struct {
	key    string
	prefer []string
	body   string
	at     time.Time // the client's fake time when it arrived
}

// server is a real HTTP server that records each request and answers it
// with handle, which is told the how-manieth request with this key it is
// (from 1).
type server struct {
	url string

	mu    sync.Mutex
	seen  []seen
	byKey map[string]int
}

func newServer(t *testing.T, clk *fakeClock, handle func(n int, w http.ResponseWriter, r *http.Request)) *server {
	t.Helper()
	s := &server{byKey: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		key := r.Header.Get(KeyHeader)
		s.mu.Lock()
		s.byKey[key]++
		n := s.byKey[key]
		got := seen{key: key, prefer: r.Header.Values(PreferHeader), body: string(body)}
		if clk != nil {
			got.at = clk.Now()
		}
		s.seen = append(s.seen, got)
		s.mu.Unlock()
		handle(n, w, r)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *server) requests() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.seen...)
}

func (s *server) keys() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make(map[string]int, len(s.byKey))
	for k, n := range s.byKey {
		keys[k] = n
	}
	return keys
}

// drop closes the connection without an answer.
func drop(t *testing.T, w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return
	}
	_ = conn.Close()
}

// post returns a POST of body to url.
func post(t *testing.T, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	return req
}

// noKeepAlive is an HTTP client that opens a connection per request, so
// that the transport never retries a request on a reused connection by
// itself: the server sees exactly the attempts the Client makes.
func noKeepAlive() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
}

// httpDate formats t as an IMF-fixdate.
func httpDate(t time.Time) string { return t.UTC().Format(http.TimeFormat) }
