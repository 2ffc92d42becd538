package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/outbox"
)

// Enqueue a receipt in the transaction that records the sale, deliver it
// with a relay, and consume it once with Process: a redelivery, as from a
// relay that died between the consumer's commit and its own, finds the
// dedupe key recorded and sends nothing.
func ExampleRelay() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("ONCEFLOW_DATABASE_URL")) // migrated with package migrations
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_sales (id text PRIMARY KEY, email text)`); err != nil {
		panic(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		panic(err)
	}

	// The sale and its receipt commit together, or neither does.
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO example_sales VALUES ('ord_1', 'ada@example.com')`); err != nil {
			return err
		}
		return ob.Enqueue(ctx, tx, outbox.Message{Topic: "receipt", DedupeKey: "receipt:ord_1",
			Payload: map[string]string{"order": "ord_1", "to": "ada@example.com"}})
	})
	if err != nil {
		panic(err)
	}

	// consume sends a receipt once per dedupe key, however often it comes.
	consume := func(ctx context.Context, m *outbox.Record) error {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			first, err := ob.Process(ctx, tx, "receipts", m.DedupeKey, func() error {
				var receipt struct{ Order, To string }
				if err := json.Unmarshal(m.Payload, &receipt); err != nil {
					return err
				}
				fmt.Printf("receipt for %s sent to %s\n", receipt.Order, receipt.To)
				return nil
			})
			if err == nil && !first {
				fmt.Println(m.DedupeKey, "was processed before: nothing sent")
			}
			return err
		})
	}
	relay, err := outbox.NewRelay(db, outbox.RelayConfig{Handlers: map[string]outbox.Handler{"receipt": consume}})
	if err != nil {
		panic(err)
	}
	stats, err := relay.RunOnce(ctx) // a sweeper runs this on a schedule (sweeper.RelayTask)
	if err != nil {
		panic(err)
	}
	fmt.Println("delivered:", stats.Delivered)

	delivered, err := ob.List(ctx, db, outbox.Filter{Topic: "receipt"})
	if err != nil {
		panic(err)
	}
	if err := consume(ctx, &delivered[0]); err != nil { // the same message again
		panic(err)
	}
	// Output:
	// receipt for ord_1 sent to ada@example.com
	// delivered: 1
	// receipt:ord_1 was processed before: nothing sent
}
