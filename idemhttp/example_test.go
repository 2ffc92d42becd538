package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/idemhttp"
)

// tenantKey is where this example's authentication puts the tenant.
type tenantKey struct{}

// authenticate stands for your authentication: it finds the caller's tenant
// from its credentials (here, one fixed bearer token) and refuses the rest.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer acme-secret-token" {
			w.Header().Set("WWW-Authenticate", "Bearer")
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, "acme")))
	})
}

// Put a handler behind the middleware, and the middleware behind your
// authentication: the tenant is what the authentication established, never
// a header the client sets, and only that tenant gets a stored response
// replayed. The handler's writes go in the transaction that stores its
// response, and a retry gets the same bytes back.
func ExampleMiddleware() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("ONCEFLOW_DATABASE_URL")) // migrated with package migrations
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_transfers (id bigserial PRIMARY KEY, key text, body text)`); err != nil {
		panic(err)
	}
	idempotent, err := idemhttp.Middleware(db, idemhttp.Config{
		Tenant: func(r *http.Request) (string, error) {
			tenant, ok := r.Context().Value(tenantKey{}).(string)
			if !ok {
				return "", errors.New("the request did not go through authentication")
			}
			return tenant, nil
		},
	})
	if err != nil {
		panic(err)
	}
	transfer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := idemhttp.Tx(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		body, _ := io.ReadAll(r.Body)
		if _, err := tx.Exec(r.Context(), `INSERT INTO example_transfers (key, body) VALUES ($1, $2)`,
			r.Header.Get("Idempotency-Key"), string(body)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"status":"sent"}`)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/transfers", authenticate(idempotent(transfer)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	key := uuid.NewString()
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/transfers", strings.NewReader(`{"amount_cents":500}`))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Authorization", "Bearer acme-secret-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	var transfers int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM example_transfers WHERE key = $1`, key).Scan(&transfers); err != nil {
		panic(err)
	}
	fmt.Println("transfers made:", transfers)
	// Output:
	// 201 {"status":"sent"} replayed: false
	// 201 {"status":"sent"} replayed: true
	// transfers made: 1
}
