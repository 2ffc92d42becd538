package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/onceflow/onceflow/idemclient"
	"github.com/onceflow/onceflow/idemhttp"
)

// httpCase compares a trivial handler behind idemhttp with the same handler
// without it, over real HTTP on loopback, and the same for a handler that
// writes one row. Both sides send through one idemclient.Client, as an
// application would; a retry during the measurement fails the case.
func httpCase(ctx context.Context, srv *server, cfg Config) ([]Result, error) {
	db, err := srv.newDatabase(ctx, 8)
	if err != nil {
		return nil, err
	}
	defer db.pool.Close()
	tenant := idemhttp.TenantFromTrustedHeader("X-Tenant-ID")
	idempotent, err := idemhttp.Middleware(db.pool, idemhttp.Config{Tenant: tenant})
	if err != nil {
		return nil, err
	}
	atomicOnly, err := idemhttp.Middleware(db.pool, idemhttp.Config{Tenant: tenant, Atomic: true})
	if err != nil {
		return nil, err
	}
	trivial := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, `{"ok":true}`) })
	writeIn := func(tx func(*http.Request) (execer, error)) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			e, err := tx(r)
			if err == nil {
				_, err = e.Exec(r.Context(), `INSERT INTO bench_orders (key, amount, status) VALUES ('h', 1, 'new')`)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			_, _ = io.WriteString(w, `{"ok":true}`)
		})
	}
	mux := http.NewServeMux()
	mux.Handle("POST /plain", trivial)
	mux.Handle("POST /idem", idempotent(trivial))
	mux.Handle("POST /plain-write", writeIn(func(*http.Request) (execer, error) { return db.pool, nil }))
	inTx := writeIn(func(r *http.Request) (execer, error) { return idemhttp.Tx(r.Context()) })
	mux.Handle("POST /idem-write", idempotent(inTx))
	mux.Handle("POST /atomic-write", atomicOnly(inTx))
	server := httptest.NewServer(mux)
	defer server.Close()
	client, retries, err := measuringClient(server.Client())
	if err != nil {
		return nil, err
	}

	// Both sides send the same request through the same client, key and
	// tenant included: the ratio measures the server, with and without
	// the middleware.
	post := func(path string) op {
		return func(ctx context.Context, i int64) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, server.URL+path, strings.NewReader(`{"amount":1}`))
			if err != nil {
				return err
			}
			req.Header.Set(idemclient.KeyHeader, fmt.Sprintf("%s-%d", path, i))
			req.Header.Set("X-Tenant-ID", "bench")
			resp, err := client.Do(ctx, req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s answered %d", path, resp.StatusCode)
			}
			return nil
		}
	}
	var results []Result
	for _, pair := range []struct {
		figure      string
		idem, plain string
		target      float64
	}{
		// A handler that touches no database against one that stores its
		// response durably: reported, the ratio is a commit's cost.
		{"idemhttp, trivial handler, vs without", "/idem", "/plain", 0},
		{"idemhttp, handler writing one row, vs without", "/idem-write", "/plain-write", 0},
		{"idemhttp Atomic, handler writing one row, vs without", "/atomic-write", "/plain-write", 0.7},
	} {
		once, floor, _, err := throughput(ctx, cfg.Rounds, cfg.Round, 1, post(pair.idem), post(pair.plain))
		if err != nil {
			return nil, err
		}
		if err := retries.check(pair.figure); err != nil {
			return results, err
		}
		r := ratio(pair.figure, once, floor, "req/s", pair.target)
		if pair.target == 0 {
			r.Target, r.Pass = "reported", true
		}
		results = append(results, r)
	}
	return results, nil
}

// measuringClient returns an idemclient.Client over hc with no retry
// budget, and the retries it sends, counted by its Wait hook. Every key is
// new, so the server has no reason to ask for a retry: one would add an
// attempt the figure does not count, and the time it waited.
func measuringClient(hc *http.Client) (*idemclient.Client, *retryCount, error) {
	retries := &retryCount{}
	client, err := idemclient.New(idemclient.Config{
		HTTPClient: hc,
		Budget:     idemclient.BudgetConfig{Burst: math.Inf(1)},
		Hooks:      idemclient.Hooks{Wait: retries.add},
	})
	return client, retries, err
}

// retryCount counts a client's retries, and keeps the first one's cause.
type retryCount struct {
	mu    sync.Mutex
	n     int
	first idemclient.WaitInfo
}

func (c *retryCount) add(w idemclient.WaitInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 {
		c.first = w
	}
	c.n++
}

// check returns an error when the client retried during the figure's
// measurement.
func (c *retryCount) check(figure string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 {
		return nil
	}
	return fmt.Errorf("%s: the client retried %d times during the measurement (first after status %d, error %v): "+
		"the figure would count the retries' waits, not the server", figure, c.n, c.first.Status, c.first.Err)
}
