package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/recovery"
)

// A request carrying an idempotency key is claimed, executed once, and every
// retry gets the stored response.
func ExampleStore_Claim() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("ONCEFLOW_DATABASE_URL")) // migrated with package migrations
	if err != nil {
		panic(err)
	}
	defer db.Close()
	store, err := recovery.New(db, recovery.Config{})
	if err != nil {
		panic(err)
	}

	handle := func(body string) {
		fp, _, err := recovery.FingerprintJSON("create_charge", []byte(body))
		if err != nil {
			fmt.Println("bad request:", err)
			return
		}
		rec, outcome, err := store.Claim(ctx, recovery.ClaimParams{
			Key:         recovery.Key{Tenant: "acme", ID: "2f1c9a"},
			Workflow:    "create_charge",
			Fingerprint: fp,
			Request:     []byte(body), // as received: what a resume decodes
		})
		switch {
		case errors.Is(err, recovery.ErrInFlight):
			fmt.Println("409: still in progress")
		case errors.Is(err, recovery.ErrMismatch):
			fmt.Println("422: key reused with a different request")
		case err != nil:
			fmt.Println("503:", err)
		case outcome == recovery.OutcomeReplay:
			fmt.Printf("replayed %d %s\n", rec.Response.Status, rec.Response.Body)
		default:
			// The work goes here; the response commits with the record.
			resp := recovery.Response{Status: 201, Body: []byte(`{"charge":"ch_1"}`)}
			if err := store.Complete(ctx, rec.Fence(), resp); err != nil {
				fmt.Println("lost the key:", err)
				return
			}
			fmt.Printf("executed %d %s\n", resp.Status, resp.Body)
		}
	}

	handle(`{"amount": 100, "currency": "usd"}`)
	handle(`{"currency":"usd","amount":1e2}`) // the same request, spelled differently
	handle(`{"amount": 999, "currency": "usd"}`)
	// Output:
	// executed 201 {"charge":"ch_1"}
	// replayed 201 {"charge":"ch_1"}
	// 422: key reused with a different request
}
