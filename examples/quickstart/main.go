// Command quickstart is onceflow in one file: POST /v1/orders creates an
// order and charges it once per Idempotency-Key, however often a client
// retries; POST /v1/notes puts the middleware in front of a plain handler.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/devdb"
	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

type Order struct {
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

type State struct {
	OrderID  int64  `json:"order_id"`
	ChargeID string `json:"charge_id"`
}

var checkout = workflow.Define("checkout",
	phase.Atomic("create_order", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, State]) error {
		return tx.QueryRow(ctx, `INSERT INTO orders (customer, amount_cents) VALUES ($1, $2) RETURNING id`,
			r.Request.Customer, r.Request.AmountCents).Scan(&r.State.OrderID)
	}),
	foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[Order, State]) error {
		id, err := charge(c.Key, c.Request.AmountCents) // c.Key: the same on every attempt
		if err != nil {
			return err // the key stays at its recovery point; a retry resumes here
		}
		c.State.ChargeID = id
		return nil
	}),
).Finish(func(s *State) workflow.Response { return workflow.JSON(http.StatusCreated, s) })

// payments stands in for a payment provider: like a real one, it answers a
// key it has seen with the charge it made for it.
var payments sync.Map

func charge(key string, cents int64) (string, error) {
	id, _ := payments.LoadOrStore(key, fmt.Sprintf("ch_%s_%d", key[4:12], cents))
	return id.(string), nil
}

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel() // Ctrl-C shuts down gracefully and stops a throwaway database
	ln, err := net.Listen("tcp", cmp.Or(os.Getenv("ADDR"), "localhost:8080"))
	check(err)
	url, stop, err := devdb.URL(ctx) // $ONCEFLOW_DATABASE_URL, else a throwaway PostgreSQL
	check(err)
	defer stop()
	pool, err := pgxpool.New(ctx, url)
	check(err)
	m, err := migrations.New(pool, migrations.Config{})
	check(err)
	_, err = m.Up(ctx)
	check(err)
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, customer text, amount_cents bigint);
		CREATE TABLE IF NOT EXISTS notes (id bigserial PRIMARY KEY, body text)`)
	check(err)
	engine, err := workflow.NewEngine(pool, workflow.Config{Workflows: []workflow.Definition{checkout}})
	check(err)

	token := os.Getenv("QUICKSTART_TOKEN")
	if token == "" {
		token = rand.Text()
		fmt.Printf("export QUICKSTART_TOKEN=%s\n", token)
	}
	tenant := func(r *http.Request) (string, error) { // your authentication here
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+token)) != 1 {
			return "", errors.New("send Authorization: Bearer $QUICKSTART_TOKEN")
		}
		return "demo", nil
	}
	orders, err := idemhttp.Workflow(engine, checkout, idemhttp.WorkflowConfig{Tenant: tenant})
	check(err)
	idempotent, err := idemhttp.Middleware(pool, idemhttp.Config{Tenant: tenant})
	check(err)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders", orders)
	mux.Handle("POST /v1/notes", idempotent(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		tx, err := idemhttp.Tx(r.Context()) // commits with the stored response, or not at all
		if err == nil {
			_, err = tx.Exec(r.Context(), `INSERT INTO notes (body) VALUES ($1)`, body)
		}
		if err != nil {
			log.Printf("save a note: %v", err) // the client gets no internals
			http.Error(w, "could not save the note", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))

	fmt.Printf("listening on http://%s\n", ln.Addr())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Shutdown(context.Background()) }()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		check(err)
	}
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
