package idemclient

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// unavailable answers 503.
func unavailable(w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) }

func TestBudgetRefusesRetriesThenRecovers(t *testing.T) {
	t.Parallel()
	// Burst 2, Ratio 0.5, two attempts an intent: the bucket holds
	// 2 → (2 −1) → (1.5 −1) → (1 −1) → 0.5: the fourth intent finds no token.
	c, clk := newClient(t, Config{MaxAttempts: 2, Budget: BudgetConfig{Ratio: 0.5, Burst: 2}})
	srv := newServer(t, clk, func(_ int, w http.ResponseWriter, _ *http.Request) { unavailable(w) })
	want := []error{ErrAttemptsExhausted, ErrAttemptsExhausted, ErrAttemptsExhausted, ErrBudgetExhausted,
		ErrAttemptsExhausted, // the fifth intent's deposit makes a token again
		ErrBudgetExhausted}
	for i, reason := range want {
		resp, err := c.Do(context.Background(), post(t, srv.url, ""))
		require.Nil(t, resp)
		require.ErrorIs(t, err, reason, "intent %d", i+1)
		var g *GiveUpError
		require.ErrorAs(t, err, &g)
		require.Equal(t, reason, g.Reason)
	}
	require.Len(t, srv.requests(), 4*2+2*1) // four intents retried once, two not at all
}

func TestBudgetBoundsRequestsUnderConcurrency(t *testing.T) {
	t.Parallel()
	budget := BudgetConfig{Ratio: 0.2, Burst: 5}
	c, clk := newClient(t, Config{Budget: budget})
	srv := newServer(t, clk, func(_ int, w http.ResponseWriter, _ *http.Request) { unavailable(w) })
	const intents = 100
	var wg sync.WaitGroup
	for range intents {
		wg.Go(func() {
			if _, err := c.Do(context.Background(), post(t, srv.url, "")); err == nil {
				t.Error("a server that always answers 503 is given up on")
			}
		})
	}
	wg.Wait()
	sent := len(srv.requests())
	require.LessOrEqual(t, float64(sent), (1+budget.Ratio)*intents+budget.Burst)
	require.Greater(t, sent, intents, "some retries were sent")
}

// TestBudgetKeepsTheTokenOfARetryNotSent: a retry whose wait the caller
// cancels is not sent, so its token goes back to the bucket for the
// intents still running.
//
// Mutation caught: the token kept by a cancelled wait (the second intent
// finds the bucket empty: ErrBudgetExhausted).
func TestBudgetKeepsTheTokenOfARetryNotSent(t *testing.T) {
	t.Parallel()
	var cancelWait context.CancelFunc // called by the Wait hook, when set
	c, clk := newClient(t, Config{Budget: BudgetConfig{Burst: 1}, Hooks: Hooks{Wait: func(WaitInfo) {
		if cancelWait != nil {
			cancelWait()
		}
	}}})
	srv := newServer(t, clk, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			unavailable(w)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cancelWait = cancel
	_, err := c.Do(ctx, post(t, srv.url, ""))
	require.ErrorIs(t, err, ErrCanceled)
	require.Len(t, srv.requests(), 1, "the retry was not sent")

	cancelWait = nil
	resp, err := c.Do(context.Background(), post(t, srv.url, ""))
	require.NoError(t, err, "the unsent retry's token is back")
	require.NoError(t, resp.Body.Close())
	require.Equal(t, 2, resp.Attempts)
}
