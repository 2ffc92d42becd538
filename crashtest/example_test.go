package crashtest_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

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

// pay pays out through b, with the step's derived key.
func pay(b *bank) phase.Step[Transfer, Sent] {
	return foreign.Mutation("pay", func(ctx context.Context, c *foreign.Call[Transfer, Sent]) error {
		c.State.PayoutID = b.pay(c.Key)
		return nil
	})
}

// record records the payout.
func record() phase.Step[Transfer, Sent] {
	return phase.Atomic("record", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Transfer, Sent]) error {
		_, err := tx.Exec(ctx, `INSERT INTO example_payouts VALUES ($1)`, r.State.PayoutID)
		return err
	})
}

// Prove that a payout workflow pays once whatever point its process dies
// at. Each world gets a migrated database of its own on the server named
// by ONCEFLOW_DATABASE_URL (a test would call crashtest.FreshDatabase) and
// a new fake bank.
func ExampleExplore() {
	ctx := context.Background()
	databases, err := crashtest.NewDatabases("") // "": the server in ONCEFLOW_DATABASE_URL
	if err != nil {
		panic(err)
	}
	defer databases.Close() // drops every database it made

	newWorld := func(ctx context.Context) (*crashtest.World[Transfer, Sent], error) {
		db, err := databases.New(ctx)
		if err != nil {
			return nil, err
		}
		if _, err := db.Exec(ctx, `CREATE TABLE example_payouts (payout_id text)`); err != nil {
			return nil, err
		}
		b := &bank{payouts: map[string]string{}}
		payout := workflow.Define("payout", pay(b), record())
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
		return &crashtest.World[Transfer, Sent]{DB: db, Workflow: payout, Check: check, Close: db.Close}, nil
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

// Prove what a deploy does to the payouts in flight: release v2 adds a
// notice after the last step. Each direction stops one release at each of
// its crash points and recovers under the other. v2 resumes every payout
// v1 left; during the rolling deploy, v1 parks the payouts v2 left after
// record, whose notice it cannot place (an operator then resumes them as
// v2). In a test, crashtest.Upgrade(t, c) does the same and fails t.
func ExampleExploreUpgrade() {
	ctx := context.Background()
	databases, err := crashtest.NewDatabases("") // "": the server in ONCEFLOW_DATABASE_URL
	if err != nil {
		panic(err)
	}
	defer databases.Close()

	newWorld := func(ctx context.Context) (*crashtest.World[Transfer, Sent], error) {
		db, err := databases.New(ctx)
		if err != nil {
			return nil, err
		}
		if _, err := db.Exec(ctx, `CREATE TABLE example_payouts (payout_id text)`); err != nil {
			return nil, err
		}
		b := &bank{payouts: map[string]string{}}
		mail := &bank{payouts: map[string]string{}} // a fake mail API, deduplicating by key as the bank does
		notify := foreign.Mutation("notify", func(ctx context.Context, c *foreign.Call[Transfer, Sent]) error {
			mail.pay(c.Key)
			return nil
		})
		v1 := workflow.Define("payout", pay(b), record()).Version("v1")
		v2 := workflow.Define("payout", pay(b), record(), notify).Version("v2")
		check := func(ctx context.Context) error {
			var rows int
			if err := db.QueryRow(ctx, `SELECT count(*) FROM example_payouts`).Scan(&rows); err != nil {
				return err
			}
			// Whichever release finished the payout: one payout, at most one
			// notice (v1 sends none).
			if rows != 1 || len(b.payouts) != 1 || len(mail.payouts) > 1 {
				return fmt.Errorf("%d payout rows, %d payouts, %d notices", rows, len(b.payouts), len(mail.payouts))
			}
			return nil
		}
		return &crashtest.World[Transfer, Sent]{DB: db, Workflow: v1, Next: v2, Check: check, Close: db.Close}, nil
	}

	report, err := crashtest.ExploreUpgrade(ctx, crashtest.Case[Transfer, Sent]{NewWorld: newWorld, Request: Transfer{Amount: 500}})
	if err != nil {
		panic(err)
	}
	for _, r := range []*crashtest.Report{report.Forward, report.Reverse} {
		fmt.Printf("%s stopped at %d points, resumed at %d\n", r.Definition.Version, len(r.Points), len(r.Resumed()))
		for _, p := range r.Parked() {
			fmt.Println("  parked when stopped", p)
		}
	}
	fmt.Println("failures:", report.Err())
	// Output:
	// v1 stopped at 5 points, resumed at 5
	// v2 stopped at 8 points, resumed at 5
	//   parked when stopped after record's commit
	//   parked when stopped before notify
	//   parked when stopped after notify's call
	// failures: <nil>
}
