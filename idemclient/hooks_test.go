package idemclient

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHooksSayWhatHappened(t *testing.T) {
	t.Parallel()
	var (
		attempts []AttemptInfo
		waits    []WaitInfo
		giveUps  []GiveUpInfo
	)
	hooks := Hooks{
		Attempt: func(a AttemptInfo) { attempts = append(attempts, a) },
		Wait:    func(w WaitInfo) { waits = append(waits, w) },
		GiveUp:  func(g GiveUpInfo) { giveUps = append(giveUps, g) },
	}
	c, clk := newClient(t, Config{HTTPClient: noKeepAlive(), MaxAttempts: 3, Hooks: hooks})
	srv := newServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/down" || n == 1:
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusServiceUnavailable)
		case n == 2:
			drop(t, w)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	})

	resp, err := c.Do(context.Background(), post(t, srv.url, ""))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	key := resp.Key
	require.Len(t, attempts, 3)
	require.Equal(t, AttemptInfo{Key: key, Attempt: 1, Status: http.StatusServiceUnavailable}, withoutDuration(attempts[0]))
	require.Equal(t, key, attempts[1].Key)
	require.Equal(t, 2, attempts[1].Attempt)
	require.Zero(t, attempts[1].Status)
	require.Error(t, attempts[1].Err)
	require.Equal(t, AttemptInfo{Key: key, Attempt: 3, Status: http.StatusCreated}, withoutDuration(attempts[2]))

	require.Len(t, waits, 2)
	require.Equal(t, WaitInfo{Key: key, Attempt: 2, Delay: waits[0].Delay, RetryAfter: 2 * time.Second, Status: http.StatusServiceUnavailable}, waits[0])
	require.GreaterOrEqual(t, waits[0].Delay, 2*time.Second)
	require.Equal(t, 3, waits[1].Attempt)
	require.Zero(t, waits[1].RetryAfter)
	require.Equal(t, attempts[1].Err, waits[1].Err)
	require.LessOrEqual(t, waits[1].Delay, 2*BaseDelayDefault, "the second retry's backoff: up to twice the base")
	require.Empty(t, giveUps)

	attempts, waits = nil, nil
	_, err = c.Do(context.Background(), post(t, srv.url+"/down", ""))
	require.Len(t, attempts, 3)
	require.Len(t, waits, 2)
	require.Len(t, giveUps, 1)
	g := giveUps[0]
	require.Equal(t, attempts[0].Key, g.Key)
	require.Equal(t, 3, g.Attempts)
	require.Equal(t, ErrAttemptsExhausted, g.Reason)
	require.Equal(t, err, error(g.Err), "the hook sees the error Do returns")
	require.Equal(t, http.StatusServiceUnavailable, g.Err.Status)
}

func withoutDuration(a AttemptInfo) AttemptInfo {
	a.Duration = 0
	return a
}

func TestConcurrentIntents(t *testing.T) {
	t.Parallel()
	var attempts, waits atomic.Int32
	c, clk := newClient(t, Config{Budget: unlimited, MaxElapsed: time.Hour, Hooks: Hooks{ // the intents share the clock their sleeps move
		Attempt: func(AttemptInfo) { attempts.Add(1) },
		Wait:    func(WaitInfo) { waits.Add(1) },
	}})
	srv := newServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusConflict) // another request with the key is in flight
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	const intents = 64
	var wg sync.WaitGroup
	keys := make([]string, intents)
	for i := range intents {
		wg.Go(func() {
			req := post(t, srv.url, fmt.Sprintf(`{"intent":%d}`, i))
			if i%2 == 0 {
				req.Header.Set(KeyHeader, fmt.Sprintf("intent-%d", i))
			}
			resp, err := c.Do(context.Background(), req)
			if !(assertNoError(t, err)) {
				return
			}
			_ = resp.Body.Close()
			keys[i] = resp.Key
			if resp.Attempts != 2 {
				t.Errorf("intent %d: %d attempts, want 2", i, resp.Attempts)
			}
		})
	}
	wg.Wait()
	got := srv.keys()
	require.Len(t, got, intents)
	for i, key := range keys {
		require.Equal(t, 2, got[key], "intent %d, key %s", i, key)
	}
	require.EqualValues(t, 2*intents, attempts.Load())
	require.EqualValues(t, intents, waits.Load())
	for _, r := range srv.requests() {
		var i int
		_, err := fmt.Sscanf(r.body, `{"intent":%d}`, &i)
		require.NoError(t, err)
		require.Equal(t, keys[i], r.key, "each intent's body under its own key")
	}
}

func assertNoError(t *testing.T, err error) bool {
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}
