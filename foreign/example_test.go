package foreign_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// Every attempt at a step derives the same downstream key, so the other
// system deduplicates a call that runs again after a crash.
func ExampleDeriveKey() {
	key := recovery.Key{Tenant: "acme", ID: "checkout-8c1f"}
	record := uuid.MustParse("0b8e4e0c-7d7b-4a5e-a1c3-1f0c9a7a2d11") // the key record's id

	charge := foreign.DeriveKey(key, record, "charge")
	again := foreign.DeriveKey(key, record, "charge")
	perItem := foreign.DeriveKey(key, record, "reserve_stock", "sku-42")

	fmt.Println(charge == again, strings.HasPrefix(charge, foreign.KeyPrefix), len(charge))
	fmt.Println(perItem != charge)

	req, _ := http.NewRequest(http.MethodPost, "https://payments.example/v1/charges", nil)
	foreign.SetHeader(req, charge)
	fmt.Println(req.Header.Get("Idempotency-Key") == charge)
	// Output:
	// true true 68
	// true
	// true
}

// A payment provider that is busy for a moment: the charge is tried again
// within the attempt, with the same key, after a short jittered wait, and
// the workflow completes on its first attempt. A 4xx answer would have
// stopped it at once (CheckResponse marks it Permanent), and a Retry-After
// longer than a third of the lease would have handed the key back until
// then (phase.Defer).
func ExampleRetry() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("ONCEFLOW_DATABASE_URL")) // migrated with package migrations
	if err != nil {
		panic(err)
	}
	defer db.Close()

	var (
		mu   sync.Mutex
		keys []string
	)
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, r.Header.Get(foreign.Header))
		if len(keys) == 1 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, `{"id":"ch_1"}`)
	}))
	defer provider.Close()

	type Payment struct{ AmountCents int64 }
	type Charged struct{ ID string }
	pay := workflow.Define("example_pay",
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[Payment, Charged]) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, provider.URL+"/charges", nil)
			if err != nil {
				return foreign.Permanent(err)
			}
			foreign.SetHeader(req, c.Key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err // a network error or a try's timeout: tried again
			}
			defer resp.Body.Close()
			if err := foreign.CheckResponse(resp); err != nil {
				return err // 408, 425, 429, 5xx: tried again; other statuses: permanent
			}
			return json.NewDecoder(resp.Body).Decode(&c.State)
		},
			foreign.Retry{Max: 4, Base: 20 * time.Millisecond, Cap: time.Second, Jitter: true},
			foreign.Timeout(10*time.Second)),
	).Finish(func(s *Charged) workflow.Response { return workflow.JSON(200, s) })

	engine, err := workflow.NewEngine(db, workflow.Config{})
	if err != nil {
		panic(err)
	}
	res, err := pay.Run(ctx, engine, workflow.Key{Tenant: "acme", ID: uuid.NewString()}, Payment{AmountCents: 1999})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Response.Status, string(res.Response.Body))
	mu.Lock()
	defer mu.Unlock()
	fmt.Println(len(keys), "calls, one key:", keys[0] == keys[1])
	// Output:
	// 200 {"ID":"ch_1"}
	// 2 calls, one key: true
}

// Ten payments at once to a provider that serves two at a time: the charge
// step is under Limit("payments"), and the engine's Pace for it lets two
// calls run at once, in this process and in every other that shares the
// database. The provider never sees a third.
func ExampleLimit() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("ONCEFLOW_DATABASE_URL")) // migrated with package migrations
	if err != nil {
		panic(err)
	}
	defer db.Close()

	var (
		mu            sync.Mutex
		running, most int
	)
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		time.Sleep(10 * time.Millisecond) // a call takes a while
		mu.Lock()
		running--
		mu.Unlock()
		fmt.Fprint(w, `{"id":"ch_1"}`)
	}))
	defer provider.Close()

	type Payment struct{ AmountCents int64 }
	type Charged struct{ ID string }
	pay := workflow.Define("example_paced_pay",
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[Payment, Charged]) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, provider.URL+"/charges", nil)
			if err != nil {
				return foreign.Permanent(err)
			}
			foreign.SetHeader(req, c.Key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if err := foreign.CheckResponse(resp); err != nil {
				return err // a 429 with Retry-After also holds every other key back
			}
			return json.NewDecoder(resp.Body).Decode(&c.State)
		}, foreign.Limit("payments")),
	)

	engine, err := workflow.NewEngine(db, workflow.Config{
		Pacing: map[string]foreign.Pace{"payments": {Concurrency: 2, Rate: 100, Burst: 10}},
	})
	if err != nil {
		panic(err)
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			if _, err := pay.Run(ctx, engine, workflow.Key{Tenant: "acme", ID: uuid.NewString()}, Payment{AmountCents: 1999}); err != nil {
				panic(err)
			}
		})
	}
	wg.Wait()
	fmt.Println("at most", most, "calls at once")
	// Output:
	// at most 2 calls at once
}
