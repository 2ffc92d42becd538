package idemhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
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

type Order struct {
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

// Validate makes Workflow answer 422, before any record, to an order that
// cannot be right.
func (o Order) Validate() error {
	if o.AmountCents <= 0 {
		return errors.New("amount_cents must be positive")
	}
	return nil
}

type Charged struct {
	OrderID  int64  `json:"order_id"`
	ChargeID string `json:"charge_id"`
}

// Serve a workflow over HTTP, behind your authentication: the handler
// decodes the body strictly into the request type, validates it, runs the
// workflow under the Idempotency-Key and answers with its response. A
// retry gets the stored bytes; the same key with another body is 422.
func ExampleWorkflow() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("ONCEFLOW_DATABASE_URL")) // migrated with package migrations
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_orders (id bigserial PRIMARY KEY, customer text, amount_cents bigint)`); err != nil {
		panic(err)
	}
	charges := map[string]string{} // a payment provider's charges, by idempotency key
	checkout := workflow.Define("checkout",
		phase.Atomic("create_order", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Charged]) error {
			return tx.QueryRow(ctx, `INSERT INTO example_orders (customer, amount_cents) VALUES ($1, $2) RETURNING id`,
				r.Request.Customer, r.Request.AmountCents).Scan(&r.State.OrderID)
		}),
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[Order, Charged]) error {
			if _, ok := charges[c.Key]; !ok { // the provider deduplicates by key
				charges[c.Key] = fmt.Sprintf("ch_%d", len(charges)+1)
			}
			c.State.ChargeID = charges[c.Key]
			return nil
		}),
	).Finish(func(s *Charged) workflow.Response { return workflow.JSON(http.StatusCreated, s) })
	engine, err := workflow.NewEngine(db, workflow.Config{})
	if err != nil {
		panic(err)
	}
	orders, err := idemhttp.Workflow(engine, checkout, idemhttp.WorkflowConfig{
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
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders", authenticate(orders))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	key := uuid.NewString()
	for _, body := range []string{
		`{"customer":"ada","amount_cents":4200}`,
		`{"amount_cents": 4200, "customer": "ada"}`, // the same order, spelled differently
		`{"customer":"ada","amount_cents":9900}`,
		`{"customer":"ada","amount_cents":-1}`,
	} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Authorization", "Bearer acme-secret-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var problem struct{ Detail string }
		_ = json.Unmarshal(answer, &problem)
		fmt.Println(strings.TrimSpace(fmt.Sprint(resp.StatusCode, " replayed: ", resp.Header.Get("Idempotent-Replayed") == "true", " ", problem.Detail)))
	}
	fmt.Println("charges made:", len(charges))
	// Output:
	// 201 replayed: false
	// 201 replayed: true
	// 422 replayed: false this Idempotency-Key was used with a different request
	// 422 replayed: false amount_cents must be positive
	// charges made: 1
}
