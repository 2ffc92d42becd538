package systemtest

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemclient"
)

// driver is the suites' clients: one idemclient.Client that sends each
// checkout under its key and retries it, as a user's client does, with no
// retry budget and no limit on attempts, so that only the suite's own
// bound ends an intent; and counters of why it retried, kept by its hooks.
type driver struct {
	client *idemclient.Client
	stats  driveStats

	// retried holds, by key, a func called after each retryable answer to
	// a request with that key (see onRetryable).
	retried sync.Map
}

// driveStats counts the attempts, and the answers that make a client
// retry: a transport error (of which timeouts), a 409, a 5xx.
type driveStats struct {
	attempts, transport, timeouts, conflicts, serverErrors atomic.Int64
}

func (s *driveStats) retryable() int64 {
	return s.transport.Load() + s.conflicts.Load() + s.serverErrors.Load()
}

// driveConfig shapes a driver.
type driveConfig struct {
	maxElapsed time.Duration // the suite's bound on one checkout
	timeout    time.Duration // on one attempt: a server that holds a request longer hangs
	baseDelay  time.Duration // the backoff, as idemclient.Config
	maxDelay   time.Duration
	conns      int // connections kept for the clients

	// observe gets the client's hooks too, after the driver's counters;
	// zero for none.
	observe idemclient.Hooks
}

func newDriver(t *testing.T, cfg driveConfig) *driver {
	t.Helper()
	d := &driver{}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = cfg.conns
	t.Cleanup(transport.CloseIdleConnections)
	client, err := idemclient.New(idemclient.Config{
		HTTPClient:  &http.Client{Transport: transport, Timeout: cfg.timeout},
		MaxAttempts: math.MaxInt,
		BaseDelay:   cfg.baseDelay,
		MaxDelay:    cfg.maxDelay,
		MaxElapsed:  cfg.maxElapsed,
		// No Prefer: wait: a key in flight is answered 409 at once, and
		// the client waits out Retry-After, as the suites' bounds assume.
		Wait:   -1,
		Budget: idemclient.BudgetConfig{Burst: math.Inf(1)}, // the suites never give up for the budget
		Hooks: idemclient.Hooks{Attempt: func(a idemclient.AttemptInfo) {
			d.count(a)
			if cfg.observe.Attempt != nil {
				cfg.observe.Attempt(a)
			}
		}, Wait: cfg.observe.Wait},
	})
	require.NoError(t, err)
	d.client = client
	return d
}

// count is the Attempt hook: it counts the attempt and, when the answer
// is one the client retries, why, and tells the key's onRetryable func.
// An attempt the caller's context ended is counted as neither.
func (d *driver) count(a idemclient.AttemptInfo) {
	d.stats.attempts.Add(1)
	var netErr net.Error
	switch {
	case errors.Is(a.Err, context.Canceled):
		return
	case a.Err != nil:
		d.stats.transport.Add(1)
		if errors.As(a.Err, &netErr) && netErr.Timeout() {
			d.stats.timeouts.Add(1)
		}
	case a.Status == http.StatusConflict:
		d.stats.conflicts.Add(1)
	case a.Status >= 500:
		d.stats.serverErrors.Add(1)
	default:
		return
	}
	if f, ok := d.retried.Load(a.Key); ok {
		f.(func())()
	}
}

// onRetryable calls f after each retryable answer to key, until the
// returned func is called.
func (d *driver) onRetryable(key string, f func()) (stop func()) {
	d.retried.Store(key, f)
	return func() { d.retried.Delete(key) }
}

// post sends a checkout for the tenant under key through the client, to
// the server at base, and returns its final answer; an error when the
// client gave up.
func (d *driver) post(ctx context.Context, base, key, body string) (answer, error) {
	req, err := checkoutRequest(ctx, base, key, body)
	if err != nil {
		return answer{}, err
	}
	resp, err := d.client.Do(ctx, req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	return readAnswer(resp.Response)
}

// answer is an answer to a checkout, as the suites compare answers.
type answer struct {
	status                int
	contentType, replayed string
	body                  []byte
}

// checkoutRequest is a checkout for the tenant under key.
func checkoutRequest(ctx context.Context, base, key, body string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/checkouts", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemclient.KeyHeader, key)
	authorize(req)
	return req, nil
}

func readAnswer(resp *http.Response) (answer, error) {
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"),
		replayed: resp.Header.Get(idemclient.ReplayedHeader), body: body}, nil
}

// post sends a checkout once, with no retry, through client: a probe of
// one server's answer.
func post(ctx context.Context, client *http.Client, base, key, body string) (answer, error) {
	req, err := checkoutRequest(ctx, base, key, body)
	if err != nil {
		return answer{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	return readAnswer(resp)
}
