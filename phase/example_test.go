package phase_test

import (
	"context"
	"fmt"
	"os"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

type Signup struct {
	Email string `json:"email"`
}

type Account struct {
	ID int64 `json:"id"`
}

// An atomic phase's writes commit together with the key's recovery point,
// or not at all: a retry of a finished signup creates no second account.
func ExampleAtomic() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("ONCEFLOW_DATABASE_URL")) // migrated with package migrations
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_accounts (id bigserial PRIMARY KEY, email text)`); err != nil {
		panic(err)
	}
	signup := workflow.Define("signup",
		phase.Atomic("create_account", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Signup, Account]) error {
			return tx.QueryRow(ctx, `INSERT INTO example_accounts (email) VALUES ($1) RETURNING id`,
				r.Request.Email).Scan(&r.State.ID)
		}),
	)
	engine, err := workflow.NewEngine(db, workflow.Config{})
	if err != nil {
		panic(err)
	}
	key := workflow.Key{Tenant: "acme", ID: uuid.NewString()}
	email := uuid.NewString() + "@example.com"
	for range 3 {
		res, err := signup.Run(ctx, engine, key, Signup{Email: email})
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Response.Status, "replayed:", res.Replayed)
	}
	var accounts int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM example_accounts WHERE email = $1`, email).Scan(&accounts); err != nil {
		panic(err)
	}
	fmt.Println("accounts:", accounts)
	// Output:
	// 200 replayed: false
	// 200 replayed: true
	// 200 replayed: true
	// accounts: 1
}
