package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

type CheckoutRequest struct {
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

type CheckoutState struct {
	OrderID  int64  `json:"order_id"`
	ChargeID string `json:"charge_id"`
}

// paymentProvider stands in for a payment provider that deduplicates by
// idempotency key, as real ones do.
type paymentProvider map[string]string

func (p paymentProvider) charge(key string, amountCents int64) string {
	if id, ok := p[key]; ok {
		return id // the same key again: the same charge
	}
	p[key] = fmt.Sprintf("ch_%d", len(p)+1)
	return p[key]
}

// Define a checkout as an atomic phase, a call to the payment provider and
// another atomic phase, then run it under the client's idempotency key.
func ExampleDefine() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("ONCEFLOW_DATABASE_URL")) // migrated with package migrations
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_orders (
		id bigserial PRIMARY KEY, customer text, amount_cents bigint, charge_id text)`); err != nil {
		panic(err)
	}

	payments := paymentProvider{}
	checkout := workflow.Define("checkout",
		phase.Atomic("create_order", func(ctx context.Context, tx pgx.Tx, r *phase.Run[CheckoutRequest, CheckoutState]) error {
			return tx.QueryRow(ctx, `INSERT INTO example_orders (customer, amount_cents) VALUES ($1, $2) RETURNING id`,
				r.Request.Customer, r.Request.AmountCents).Scan(&r.State.OrderID)
		}),
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[CheckoutRequest, CheckoutState]) error {
			c.State.ChargeID = payments.charge(c.Key, c.Request.AmountCents) // c.Key: derived, the same on every attempt
			return nil
		}),
		phase.Atomic("record_charge", func(ctx context.Context, tx pgx.Tx, r *phase.Run[CheckoutRequest, CheckoutState]) error {
			_, err := tx.Exec(ctx, `UPDATE example_orders SET charge_id = $2 WHERE id = $1`, r.State.OrderID, r.State.ChargeID)
			return err
		}),
	).Finish(func(s *CheckoutState) workflow.Response {
		return workflow.JSON(201, map[string]any{"charge_id": s.ChargeID, "status": "paid"})
	})

	engine, err := workflow.NewEngine(db, workflow.Config{})
	if err != nil {
		panic(err)
	}
	key := workflow.Key{Tenant: "acme", ID: uuid.NewString()} // the client's Idempotency-Key
	req := CheckoutRequest{Customer: "cus_1", AmountCents: 1999}
	for range 2 {
		res, err := checkout.Run(ctx, engine, key, req)
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Response.Status, string(res.Response.Body), "replayed:", res.Replayed)
	}
	// Output:
	// 201 {"charge_id":"ch_1","status":"paid"} replayed: false
	// 201 {"charge_id":"ch_1","status":"paid"} replayed: true
}

type CaptureRequest struct {
	OrderID int `json:"order_id"`
}

type CaptureState struct {
	CaptureID string `json:"capture_id"`
}

// A batch job whose intent outlives its process: it captures the payment of
// five orders, each under a key derived from the order, so that it can be
// stopped at any point and started again from the top. Finished orders
// replay at once, the interrupted one resumes after its last committed
// step, and nothing is captured twice.
func ExampleKeyOf() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("ONCEFLOW_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_captures (
		tenant text, order_id int, status text, capture_id text, PRIMARY KEY (tenant, order_id))`); err != nil {
		panic(err)
	}
	tenant := "shop-" + uuid.NewString() // a tenant of this example's own

	var (
		captures = map[string]int{} // what the provider did, per downstream key
		stopJob  context.CancelFunc // set while the first run may be stopped
	)
	capture := workflow.Define("capture",
		phase.Atomic("reserve", func(ctx context.Context, tx pgx.Tx, r *phase.Run[CaptureRequest, CaptureState]) error {
			_, err := tx.Exec(ctx, `INSERT INTO example_captures (tenant, order_id, status) VALUES ($1, $2, 'reserved')`,
				r.Key.Tenant, r.Request.OrderID)
			return err
		}),
		foreign.Mutation("capture", func(ctx context.Context, c *foreign.Call[CaptureRequest, CaptureState]) error {
			if c.Request.OrderID == 3 && stopJob != nil {
				stopJob() // the job is stopped while order 3's capture is under way
				return ctx.Err()
			}
			captures[c.Key]++
			c.State.CaptureID = "cap_" + strconv.Itoa(c.Request.OrderID)
			return nil
		}),
		phase.Atomic("record", func(ctx context.Context, tx pgx.Tx, r *phase.Run[CaptureRequest, CaptureState]) error {
			_, err := tx.Exec(ctx, `UPDATE example_captures SET status = 'captured', capture_id = $3
				WHERE tenant = $1 AND order_id = $2`, r.Key.Tenant, r.Request.OrderID, r.State.CaptureID)
			return err
		}),
	)
	engine, err := workflow.NewEngine(db, workflow.Config{})
	if err != nil {
		panic(err)
	}

	job := func(ctx context.Context) {
		for id := 1; id <= 5; id++ {
			key := workflow.KeyOf(tenant, "order", strconv.Itoa(id), "capture")
			res, err := capture.Run(ctx, engine, key, CaptureRequest{OrderID: id})
			switch {
			case errors.Is(err, context.Canceled):
				fmt.Printf("order %d: stopped\n", id)
				return
			case err != nil:
				panic(err)
			case res.Replayed:
				fmt.Printf("order %d: already done\n", id)
			case res.ResumedFrom != "":
				fmt.Printf("order %d: resumed after %s\n", id, res.ResumedFrom)
			default:
				fmt.Printf("order %d: captured\n", id)
			}
		}
	}

	first, cancel := context.WithCancel(ctx)
	stopJob = cancel
	fmt.Println("first run:")
	job(first)
	stopJob = nil
	fmt.Println("second run, from the top:")
	job(ctx)

	var rows int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM example_captures WHERE tenant = $1 AND status = 'captured'`,
		tenant).Scan(&rows); err != nil {
		panic(err)
	}
	most := 0
	for _, n := range captures {
		most = max(most, n)
	}
	fmt.Printf("orders captured: %d; provider calls per key: at most %d\n", rows, most)
	// Output:
	// first run:
	// order 1: captured
	// order 2: captured
	// order 3: stopped
	// second run, from the top:
	// order 1: already done
	// order 2: already done
	// order 3: resumed after reserve
	// order 4: captured
	// order 5: captured
	// orders captured: 5; provider calls per key: at most 1
}
