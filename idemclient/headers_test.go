package idemclient

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/workflow"
)

// conflicts tells of each claim that found its key in flight.
type conflicts struct {
	workflow.NopObserver
	found chan struct{}
}

func (c conflicts) Claimed(_, outcome string) {
	if outcome == workflow.ClaimConflict {
		select {
		case c.found <- struct{}{}:
		default:
		}
	}
}

// holdFirst sends body under key through a client that does not wait, to
// a handler that holds it until s.release is closed, and returns the
// channel its answer's body comes on, once the handler holds it.
func holdFirst(t *testing.T, s *charges, key, body string) <-chan string {
	t.Helper()
	first := make(chan string, 1)
	c, _ := newClient(t, Config{Wait: -1})
	go func() {
		defer close(first)
		resp, err := c.Do(context.Background(), withKey(post(t, s.url, body), key))
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
	t.Cleanup(s.letGo) // before the server closes, which waits for the handler
	return first
}

// letGo releases the handler that holds a slow request, once.
func (s *charges) letGo() { s.let.Do(func() { close(s.release) }) }

// TestPreferWaitAgainstTheMiddleware: a duplicate of an intent in flight,
// sent with the Client's Prefer: wait, is held by the middleware until the
// first request is done, and gets its answer in one attempt.
func TestPreferWaitAgainstTheMiddleware(t *testing.T) {
	t.Parallel()
	found := make(chan struct{}, 1)
	s := newChargesWith(t, idemhttp.Config{Observer: conflicts{found: found}}, nil)
	key := NewKey()
	const body = `{"slow":true}`
	first := holdFirst(t, s, key, body)

	// The first request is released once the duplicate found its key in
	// flight, and so is waiting for it.
	go func() {
		<-found
		s.letGo()
	}()
	var (
		mu       sync.Mutex
		attempts []AttemptInfo
	)
	c, _ := newClient(t, Config{Hooks: Hooks{Attempt: func(a AttemptInfo) {
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, a)
	}}})
	resp, got := send(t, c, s.url, key, body)
	require.Equal(t, http.StatusCreated, resp.StatusCode, got)
	require.Equal(t, 1, resp.Attempts)
	require.Len(t, attempts, 1, "one HTTP attempt")
	require.True(t, resp.Replayed)
	require.Equal(t, "wait=10", resp.Header.Get(PreferenceAppliedHeader), "the middleware held the duplicate (WaitDefault, 10s)")
	require.Equal(t, <-first, got, "the duplicate gets the first request's answer")
	require.Equal(t, map[string]int{key: 1}, s.chargesByKey(t))
}

// TestKeyLifetimeAgainstTheMiddleware: a middleware that keeps keys 10s
// answers a duplicate of an intent in flight 409, with Retry-After (the
// lease left, 2s) and the key's expiry; the Client, on a fake clock, sends
// retries while they arrive within the lifetime, less its margin, and then
// gives up (ErrKeyExpired) rather than send one the server may take for a
// new request.
func TestKeyLifetimeAgainstTheMiddleware(t *testing.T) {
	t.Parallel()
	const lifetime, lease = 10 * time.Second, 2 * time.Second
	key := NewKey()
	var (
		mu   sync.Mutex
		clk  = &fakeClock{now: epoch}
		sent []time.Time // the fake time of the duplicate's attempts
	)
	s := newChargesWith(t, idemhttp.Config{KeyLifetime: lifetime, Lease: lease}, func(r *http.Request) {
		if r.Header.Get(KeyHeader) == key {
			mu.Lock()
			defer mu.Unlock()
			sent = append(sent, clk.Now())
		}
	})
	const body = `{"slow":true}`
	first := holdFirst(t, s, key, body)
	mu.Lock()
	sent = nil // the first request's
	mu.Unlock()

	c, err := New(Config{Wait: -1, MaxElapsed: time.Hour, MaxAttempts: 100})
	require.NoError(t, err)
	c.clock = clk
	_, err = c.Do(context.Background(), withKey(post(t, s.url, body), key))
	require.ErrorIs(t, err, ErrKeyExpired)
	var g *GiveUpError
	require.ErrorAs(t, err, &g)
	require.Equal(t, http.StatusConflict, g.Status)
	require.NotEmpty(t, g.Header.Get(ExpiresHeader))

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, sent, g.Attempts, "every attempt reached the server")
	require.GreaterOrEqual(t, g.Attempts, 3, "retries within the lifetime were sent")
	t.Logf("%d attempts, at %v of the fake clock", g.Attempts, sent)
	for _, at := range sent {
		require.Less(t, at.Sub(epoch), lifetime-lifetime/10, "no retry after the key's lifetime, less the margin")
	}

	s.letGo()
	<-first
	require.Equal(t, map[string]int{key: 1}, s.chargesByKey(t))
}
