package idemclient

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// expiring answers 503 with Retry-After and the key's lifetime, as the
// server's clock, at serverOffset from the client's, tells them.
type expiring struct {
	retryAfter   []string        // by attempt; the last repeats
	lifetime     []time.Duration // by attempt, from the attempt; the last repeats
	serverOffset time.Duration
	noDate       bool
}

func (e expiring) handler(clk *fakeClock) func(n int, w http.ResponseWriter, r *http.Request) {
	return func(n int, w http.ResponseWriter, r *http.Request) {
		serverNow := clk.Now().Add(e.serverOffset)
		w.Header().Set("Date", httpDate(serverNow))
		if e.noDate {
			w.Header()["Date"] = nil
		}
		w.Header().Set(ExpiresHeader, httpDate(serverNow.Add(e.lifetime[min(n, len(e.lifetime))-1])))
		w.Header().Set("Retry-After", e.retryAfter[min(n, len(e.retryAfter))-1])
		w.WriteHeader(http.StatusServiceUnavailable)
	}
}

func TestNoRetryPastTheKeyLifetime(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		server   expiring
		attempts int
		reason   error
	}{
		// 30s lifetime: the last retry goes before 27s (a tenth off).
		"retried within it": {expiring{retryAfter: []string{"20"}, lifetime: []time.Duration{30 * time.Second}}, 2, ErrKeyExpired},
		// The margin: a retry at 450s (and a jitter of up to 45s) of a 500s
		// lifetime would be within it, but not within 500s − 50s.
		"not within the margin": {expiring{retryAfter: []string{"450"}, lifetime: []time.Duration{500 * time.Second}}, 1, ErrKeyExpired},
		// The margin is a minute at most: a retry at 9020s (and a jitter of
		// up to 902s) of a 10000s lifetime is in time.
		"a minute's margin at most": {expiring{retryAfter: []string{"9020", "100000"}, lifetime: []time.Duration{10000 * time.Second}}, 2, ErrKeyExpired},
		// The earliest expiry counts: a later, longer one does not extend it.
		"the earliest expiry counts": {expiring{retryAfter: []string{"1", "36"}, lifetime: []time.Duration{40 * time.Second, time.Hour}}, 2, ErrKeyExpired},
		// A server an hour behind: its Date says what its Expires means.
		"read against the server's Date": {expiring{retryAfter: []string{"1", "1", "1000"}, lifetime: []time.Duration{30 * time.Second}, serverOffset: -time.Hour}, 3, ErrKeyExpired},
		// Without Date, Expires is read on the client's clock.
		"without Date": {expiring{retryAfter: []string{"1", "1", "1000"}, lifetime: []time.Duration{30 * time.Second}, noDate: true}, 3, ErrKeyExpired},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, clk := newClient(t, Config{MaxElapsed: 24 * time.Hour})
			srv := newServer(t, clk, tc.server.handler(clk))
			_, err := c.Do(context.Background(), post(t, srv.url, ""))
			require.ErrorIs(t, err, tc.reason)
			var g *GiveUpError
			require.ErrorAs(t, err, &g)
			require.Equal(t, tc.attempts, g.Attempts)
			got := srv.requests()
			require.Len(t, got, tc.attempts)
			first := got[0].at
			lifetime := tc.server.lifetime[0]
			margin := min(time.Minute, lifetime/10)
			for _, r := range got {
				require.LessOrEqual(t, r.at.Sub(first), lifetime-margin, "a retry within the key's lifetime, less the margin")
			}
		})
	}
}

// TestGiveUpKeepsTheEarliestExpiry: the expiry an earlier attempt was told
// survives a last attempt that got no answer.
func TestGiveUpKeepsTheEarliestExpiry(t *testing.T) {
	t.Parallel()
	c, clk := newClient(t, Config{MaxAttempts: 2, HTTPClient: noKeepAlive()})
	told := expiring{retryAfter: []string{"1"}, lifetime: []time.Duration{time.Hour}}.handler(clk)
	srv := newServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			told(n, w, r)
			return
		}
		drop(t, w)
	})
	start := clk.Now()
	_, err := c.Do(context.Background(), post(t, srv.url, ""))
	var g *GiveUpError
	require.ErrorAs(t, err, &g)
	require.ErrorIs(t, err, ErrAttemptsExhausted)
	require.Zero(t, g.Status, "the last attempt got no answer")
	require.WithinDuration(t, start.Add(time.Hour), g.Expires, 2*time.Second, "the first attempt's expiry")
	require.Contains(t, g.Error(), "2 attempts")
}
