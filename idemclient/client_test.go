package idemclient

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// unlimited is a budget that never refuses, for tests about other bounds.
var unlimited = BudgetConfig{Burst: math.Inf(1)}

// failTwice answers a key's first attempt 503, drops its second's
// connection, and answers the third 201.
func failTwice(t *testing.T) func(n int, w http.ResponseWriter, r *http.Request) {
	return func(n int, w http.ResponseWriter, r *http.Request) {
		switch n {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			drop(t, w)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}
}

func TestOneKeyPerIntent(t *testing.T) {
	t.Parallel()
	c, clk := newClient(t, Config{HTTPClient: noKeepAlive(), Budget: unlimited})
	srv := newServer(t, clk, failTwice(t))

	const intents = 20
	for range intents {
		resp, err := c.Do(context.Background(), post(t, srv.url, `{"amount":1}`))
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		require.Equal(t, 3, resp.Attempts)
		key, err := uuid.Parse(resp.Key)
		require.NoError(t, err)
		require.Equal(t, uuid.Version(7), key.Version())
	}
	keys := srv.keys()
	require.Len(t, keys, intents, "one key per intent, however many attempts")
	for key, n := range keys {
		require.Equal(t, 3, n, "key %s", key)
	}
}

func TestCallerKeyIsKept(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"order-42", `"order-42";v=1`} {
		c, clk := newClient(t, Config{HTTPClient: noKeepAlive()})
		srv := newServer(t, clk, failTwice(t))
		req := post(t, srv.url, "{}")
		req.Header.Set(KeyHeader, key)

		resp, err := c.Do(context.Background(), req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, key, resp.Key)
		require.Equal(t, map[string]int{key: 3}, srv.keys())
		require.Equal(t, http.Header{KeyHeader: {key}}, req.Header, "the caller's request is not modified")
	}
}

func TestRetryAfterIsAMinimum(t *testing.T) {
	t.Parallel()
	const asked = 7 * time.Second
	for name, header := range map[string]func(now time.Time) http.Header{
		"delta-seconds": func(time.Time) http.Header { return http.Header{"Retry-After": {"7"}} },
		"HTTP-date": func(now time.Time) http.Header {
			return http.Header{"Date": {httpDate(now)}, "Retry-After": {httpDate(now.Add(asked))}}
		},
		"HTTP-date without Date": func(now time.Time) http.Header {
			return http.Header{"Date": nil, "Retry-After": {httpDate(now.Add(asked))}}
		},
		"HTTP-date read against a skewed Date": func(now time.Time) http.Header {
			serverNow := now.Add(-time.Hour)
			return http.Header{"Date": {httpDate(serverNow)}, "Retry-After": {httpDate(serverNow.Add(asked))}}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var waits []WaitInfo
			c, clk := newClient(t, Config{Hooks: Hooks{Wait: func(w WaitInfo) { waits = append(waits, w) }}})
			srv := newServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					for k, v := range header(clk.Now()) {
						w.Header()[k] = v
					}
					w.WriteHeader(http.StatusTooManyRequests)
				}
			})
			resp, err := c.Do(context.Background(), post(t, srv.url, ""))
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			require.Equal(t, 2, resp.Attempts)

			require.Len(t, waits, 1)
			require.Equal(t, asked, waits[0].RetryAfter)
			require.GreaterOrEqual(t, waits[0].Delay, asked)
			require.LessOrEqual(t, waits[0].Delay, asked+BaseDelayDefault+asked/10, "the jitter on top is small")
			require.Equal(t, []time.Duration{waits[0].Delay}, clk.sleeps())
			got := srv.requests()
			require.GreaterOrEqual(t, got[1].at.Sub(got[0].at), asked)
		})
	}
}

func TestWhatIsRetried(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		retry  bool
	}{
		{http.StatusBadRequest, false}, {http.StatusUnauthorized, false}, {http.StatusForbidden, false},
		{http.StatusNotFound, false}, {http.StatusPreconditionFailed, false},
		{http.StatusUnprocessableEntity, false}, {http.StatusPreconditionRequired, false},
		{http.StatusNotImplemented, false}, {http.StatusHTTPVersionNotSupported, false},
		{http.StatusConflict, true}, {http.StatusTooEarly, true}, {http.StatusTooManyRequests, true},
		{http.StatusInternalServerError, true}, {http.StatusBadGateway, true},
		{http.StatusServiceUnavailable, true}, {http.StatusGatewayTimeout, true},
	} {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			t.Parallel()
			c, clk := newClient(t, Config{})
			srv := newServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					w.WriteHeader(tc.status)
					_, _ = io.WriteString(w, "first answer")
					return
				}
				_, _ = io.WriteString(w, "second answer")
			})
			resp, err := c.Do(context.Background(), post(t, srv.url, ""))
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			if tc.retry {
				require.Equal(t, http.StatusOK, resp.StatusCode)
				require.Equal(t, "second answer", string(body))
				require.Equal(t, 2, resp.Attempts)
			} else {
				require.Equal(t, tc.status, resp.StatusCode, "a final answer is returned as it is")
				require.Equal(t, "first answer", string(body))
				require.Equal(t, 1, resp.Attempts)
				require.Len(t, srv.requests(), 1)
			}
		})
	}
}

func TestNetworkErrorsAreRetried(t *testing.T) {
	t.Parallel()
	t.Run("connection dropped", func(t *testing.T) {
		t.Parallel()
		c, clk := newClient(t, Config{HTTPClient: noKeepAlive()})
		srv := newServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
			if n < 3 {
				drop(t, w)
			}
		})
		resp, err := c.Do(context.Background(), post(t, srv.url, ""))
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, 3, resp.Attempts)
		require.Len(t, srv.keys(), 1)
	})
	t.Run("connection refused", func(t *testing.T) {
		t.Parallel()
		closed := httptest.NewServer(http.NotFoundHandler())
		closed.Close()
		c, _ := newClient(t, Config{MaxAttempts: 3})
		resp, err := c.Do(context.Background(), post(t, closed.URL, ""))
		require.Nil(t, resp)
		var g *GiveUpError
		require.ErrorAs(t, err, &g)
		require.ErrorIs(t, err, ErrAttemptsExhausted)
		require.Equal(t, 3, g.Attempts)
		require.Error(t, g.Err)
		require.Zero(t, g.Status)
	})
	t.Run("attempt timed out", func(t *testing.T) {
		t.Parallel()
		c, clk := newClient(t, Config{HTTPClient: &http.Client{Timeout: 100 * time.Millisecond}})
		srv := newServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
			if n == 1 {
				<-r.Context().Done() // until the client gives the attempt up
			}
		})
		resp, err := c.Do(context.Background(), post(t, srv.url, ""))
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, 2, resp.Attempts)
	})
	t.Run("an error a retry would not mend", func(t *testing.T) {
		t.Parallel()
		c, _ := newClient(t, Config{})
		resp, err := c.Do(context.Background(), post(t, "unknown://example.com/", ""))
		require.Nil(t, resp)
		require.ErrorIs(t, err, ErrNotRetryable)
		var g *GiveUpError
		require.ErrorAs(t, err, &g)
		require.Equal(t, 1, g.Attempts)
	})
}

func TestCallerCancellationIsNotRetried(t *testing.T) {
	t.Parallel()
	t.Run("during an attempt", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c, clk := newClient(t, Config{})
		srv := newServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
			cancel()
			<-r.Context().Done()
		})
		resp, err := c.Do(ctx, post(t, srv.url, ""))
		require.Nil(t, resp)
		require.ErrorIs(t, err, ErrCanceled)
		require.ErrorIs(t, err, context.Canceled)
		require.Len(t, srv.requests(), 1)
	})
	t.Run("between attempts", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c, clk := newClient(t, Config{Hooks: Hooks{Wait: func(WaitInfo) { cancel() }}})
		srv := newServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		resp, err := c.Do(ctx, post(t, srv.url, ""))
		require.Nil(t, resp)
		require.ErrorIs(t, err, ErrCanceled)
		require.ErrorIs(t, err, context.Canceled)
		var g *GiveUpError
		require.ErrorAs(t, err, &g)
		require.Equal(t, http.StatusServiceUnavailable, g.Status)
		require.Len(t, srv.requests(), 1)
	})
}

func TestBodyIsReplayedOnEveryAttempt(t *testing.T) {
	t.Parallel()
	const body = `{"amount_cents":1250,"currency":"EUR"}`
	for name, newBody := range map[string]func() io.Reader{
		"GetBody":  func() io.Reader { return strings.NewReader(body) },
		"buffered": func() io.Reader { return io.MultiReader(strings.NewReader(body)) }, // no GetBody
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, clk := newClient(t, Config{HTTPClient: noKeepAlive()})
			srv := newServer(t, clk, failTwice(t))
			req, err := http.NewRequest(http.MethodPost, srv.url, newBody())
			require.NoError(t, err)
			require.Equal(t, name == "GetBody", req.GetBody != nil)

			resp, err := c.Do(context.Background(), req)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			got := srv.requests()
			require.Len(t, got, 3)
			for i, r := range got {
				require.Equal(t, body, r.body, "attempt %d", i+1)
			}
		})
	}
	t.Run("too large to buffer", func(t *testing.T) {
		t.Parallel()
		c, clk := newClient(t, Config{MaxBody: int64(len(body)) - 1})
		srv := newServer(t, clk, func(int, http.ResponseWriter, *http.Request) {})
		req, err := http.NewRequest(http.MethodPost, srv.url, io.MultiReader(strings.NewReader(body)))
		require.NoError(t, err)
		resp, err := c.Do(context.Background(), req)
		require.Nil(t, resp)
		require.ErrorIs(t, err, ErrBodyTooLarge)
		require.Empty(t, srv.requests(), "nothing is sent")
	})
}

func TestPreferWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		wait   time.Duration
		prefer []string // the request's own
		want   []string
	}{
		{0, nil, []string{"wait=10"}},
		{1500 * time.Millisecond, nil, []string{"wait=2"}},
		{-1, nil, nil},
		{0, []string{"respond-async, wait=3"}, []string{"respond-async, wait=3"}},
		{0, []string{"return=minimal"}, []string{"return=minimal", "wait=10"}},
	} {
		c, clk := newClient(t, Config{Wait: tc.wait})
		srv := newServer(t, clk, func(int, http.ResponseWriter, *http.Request) {})
		req := post(t, srv.url, "")
		req.Header[PreferHeader] = tc.prefer
		resp, err := c.Do(context.Background(), req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, tc.want, srv.requests()[0].prefer, "Wait %s, Prefer %q", tc.wait, tc.prefer)
	}
}

func TestReplayedIsReported(t *testing.T) {
	t.Parallel()
	c, clk := newClient(t, Config{})
	srv := newServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
		if n > 1 {
			w.Header().Set(ReplayedHeader, "true")
		}
	})
	req := post(t, srv.url, "")
	req.Header.Set(KeyHeader, NewKey())
	for _, want := range []bool{false, true} {
		resp, err := c.Do(context.Background(), req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, want, resp.Replayed)
	}
}

func TestDeadline(t *testing.T) {
	t.Parallel()
	t.Run("a wait that would cross MaxElapsed is not slept", func(t *testing.T) {
		t.Parallel()
		c, clk := newClient(t, Config{MaxElapsed: 10 * time.Second})
		srv := newServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		resp, err := c.Do(context.Background(), post(t, srv.url, ""))
		require.Nil(t, resp)
		require.ErrorIs(t, err, ErrDeadline)
		require.Empty(t, clk.sleeps())
		require.Len(t, srv.requests(), 1)
	})
	t.Run("the context's deadline bounds too", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		c, clk := newClient(t, Config{MaxElapsed: 24 * time.Hour})
		srv := newServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "7200")
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		_, err := c.Do(ctx, post(t, srv.url, ""))
		require.ErrorIs(t, err, ErrDeadline)
		require.Empty(t, clk.sleeps())
	})
	t.Run("an attempt is cut off at the deadline", func(t *testing.T) {
		t.Parallel()
		c, clk := newClient(t, Config{MaxElapsed: 200 * time.Millisecond})
		srv := newServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		})
		_, err := c.Do(context.Background(), post(t, srv.url, ""))
		require.ErrorIs(t, err, ErrDeadline)
		require.Len(t, srv.requests(), 1)
	})
}

func TestGiveUpKeepsTheLastAnswer(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 2*MaxErrorBody)
	c, clk := newClient(t, Config{MaxAttempts: 2})
	srv := newServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Attempt", fmt.Sprint(n))
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, big)
	})
	resp, err := c.Do(context.Background(), post(t, srv.url, ""))
	require.Nil(t, resp)
	var g *GiveUpError
	require.ErrorAs(t, err, &g)
	require.ErrorIs(t, err, ErrAttemptsExhausted)
	require.Equal(t, http.StatusBadGateway, g.Status)
	require.Equal(t, "2", g.Header.Get("X-Attempt"))
	require.Equal(t, big[:MaxErrorBody], string(g.Body), "the body is kept, bounded")
	require.Equal(t, 2, g.Attempts)
	require.Equal(t, srv.requests()[0].key, g.Key)
	require.Contains(t, g.Error(), g.Key)
}

func TestNewRefusesNegativeValues(t *testing.T) {
	t.Parallel()
	for field, cfg := range map[string]Config{
		"MaxAttempts":  {MaxAttempts: -1},
		"BaseDelay":    {BaseDelay: -1},
		"MaxDelay":     {MaxDelay: -1},
		"MaxElapsed":   {MaxElapsed: -1},
		"MaxBody":      {MaxBody: -1},
		"Budget.Ratio": {Budget: BudgetConfig{Ratio: -0.1}},
		"Budget.Burst": {Budget: BudgetConfig{Burst: math.NaN()}},
	} {
		_, err := New(cfg)
		var ce *ConfigError
		require.ErrorAs(t, err, &ce, field)
		require.Equal(t, field, ce.Field)
	}
	_, err := New(Config{Wait: -1})
	require.NoError(t, err, "a negative Wait sends no Prefer")
}
