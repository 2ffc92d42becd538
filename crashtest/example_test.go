package crashtest_test

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/crashtest"
	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

type Transfer struct {
	Amount int64 `json:"amount"`
}

type Sent struct {
	PayoutID string `json:"payout_id"`
}

// bank is a fake payout API that deduplicates by idempotency key and counts
// payouts.
type bank struct {
	mu      sync.Mutex
	payouts map[string]string
}

func (b *bank) pay(key string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if id, ok := b.payouts[key]; ok {
		return id
	}
	b.payouts[key] = fmt.Sprintf("po_%d", len(b.payouts)+1)
	return b.payouts[key]
}

// Prove that a payout workflow pays once whatever point its process dies
// at. Each world empties the example's tables and starts a new fake bank;
// a test would rather give each world a database of its own.
func ExampleExplore() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("ONCEFLOW_DATABASE_URL")) // migrated with package migrations
	if err != nil {
		panic(err)
	}
	defer db.Close()

	newWorld := func(ctx context.Context) (*crashtest.World[Transfer, Sent], error) {
		if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_payouts (payout_id text);
			TRUNCATE example_payouts, onceflow_keys`); err != nil {
			return nil, err
		}
		b := &bank{payouts: map[string]string{}}
		payout := workflow.Define("payout",
			foreign.Mutation("pay", func(ctx context.Context, c *foreign.Call[Transfer, Sent]) error {
				c.State.PayoutID = b.pay(c.Key)
				return nil
			}),
			phase.Atomic("record", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Transfer, Sent]) error {
				_, err := tx.Exec(ctx, `INSERT INTO example_payouts VALUES ($1)`, r.State.PayoutID)
				return err
			}),
		)
		check := func(ctx context.Context) error {
			var rows int
			if err := db.QueryRow(ctx, `SELECT count(*) FROM example_payouts`).Scan(&rows); err != nil {
				return err
			}
			if rows != 1 || len(b.payouts) != 1 {
				return fmt.Errorf("%d payout rows and %d payouts, want one of each", rows, len(b.payouts))
			}
			return nil
		}
		return &crashtest.World[Transfer, Sent]{DB: db, Workflow: payout, Check: check}, nil
	}

	report, err := crashtest.Explore(ctx, crashtest.Case[Transfer, Sent]{NewWorld: newWorld, Request: Transfer{Amount: 500}})
	if err != nil {
		panic(err)
	}
	for _, p := range report.Points {
		fmt.Println(p)
	}
	fmt.Println("experiments:", len(report.Outcomes), "failures:", report.Err())
	// Output:
	// before pay
	// after pay's call
	// before record
	// before record's commit
	// after record's commit
	// experiments: 10 failures: <nil>
}
