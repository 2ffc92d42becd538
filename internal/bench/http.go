package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/onceflow/onceflow/idemhttp"
)

// httpCase compares a trivial handler behind idemhttp with the same handler
// without it, over real HTTP on loopback, and the same for a handler that
// writes one row.
func httpCase(ctx context.Context, srv *server, cfg Config) ([]Result, error) {
	db, err := srv.newDatabase(ctx, 8)
	if err != nil {
		return nil, err
	}
	defer db.pool.Close()
	idempotent, err := idemhttp.Middleware(db.pool, idemhttp.Config{Tenant: idemhttp.TenantFromTrustedHeader("X-Tenant-ID")})
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
	mux.Handle("POST /idem-write", idempotent(writeIn(func(r *http.Request) (execer, error) { return idemhttp.Tx(r.Context()) })))
	server := httptest.NewServer(mux)
	defer server.Close()
	client := server.Client()

	post := func(path string, keyed bool) op {
		return func(ctx context.Context, i int64) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, server.URL+path, strings.NewReader(`{"amount":1}`))
			if err != nil {
				return err
			}
			if keyed {
				req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", path, i))
				req.Header.Set("X-Tenant-ID", "bench")
			}
			resp, err := client.Do(req)
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
		{"idemhttp, trivial handler, vs without", "/idem", "/plain", 0.8},
		{"idemhttp, handler writing one row, vs without", "/idem-write", "/plain-write", 0},
	} {
		once, floor, _, err := throughput(ctx, cfg.Rounds, cfg.Round, 1, post(pair.idem, true), post(pair.plain, false))
		if err != nil {
			return nil, err
		}
		r := ratio(pair.figure, once, floor, "req/s", pair.target)
		if pair.target == 0 {
			r.Target, r.Pass = "reported", true
		}
		results = append(results, r)
	}
	return results, nil
}
