package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// generousPace limits nothing a benchmark reaches: what is measured is the
// cost of taking and giving back a turn, not a wait.
var generousPace = foreign.Pace{Concurrency: 1000, Rate: foreign.PaceRateLimit, Burst: foreign.PaceBurstLimit}

// pacedCheckoutWorkflow is checkoutWorkflow with its foreign step paced
// (foreign.Limit), under another name so that both run on one engine.
func pacedCheckoutWorkflow() *workflow.Workflow[Order, Paid] {
	return workflow.Define("paced_checkout",
		phase.Atomic("create_order", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			return tx.QueryRow(ctx, `INSERT INTO bench_orders (key, amount, status) VALUES ($1, $2, 'new') RETURNING id`,
				r.Key.ID, r.Request.Amount).Scan(&r.State.OrderID)
		}),
		foreign.Mutation("charge", func(context.Context, *foreign.Call[Order, Paid]) error { return nil },
			foreign.Limit("payments")),
		phase.Atomic("record_charge", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			_, err := tx.Exec(ctx, `UPDATE bench_orders SET status = 'paid' WHERE id = $1`, r.State.OrderID)
			return err
		}),
	)
}

// pacingCase measures what a Limit costs a call: the checkout with its
// foreign step paced by a Pace it never reaches, against the same checkout
// unpaced, in alternation on one engine. The floor here is onceflow
// itself; the note gives the cost per call in time.
func pacingCase(ctx context.Context, srv *server, cfg Config) ([]Result, error) {
	db, err := srv.newDatabase(ctx, 32)
	if err != nil {
		return nil, err
	}
	defer db.pool.Close()
	engine, err := workflow.NewEngine(db.pool, workflow.Config{Pacing: map[string]foreign.Pace{"payments": generousPace}})
	if err != nil {
		return nil, err
	}
	paced, plain := pacedCheckoutWorkflow(), checkoutWorkflow()
	var results []Result
	for _, c := range []int{1, 16} {
		once, floor, gaveUp, err := throughput(ctx, cfg.Rounds, cfg.Round, c,
			checkoutOnceflow(engine, paced, fmt.Sprintf("p%d-", c)), checkoutOnceflow(engine, plain, fmt.Sprintf("u%d-", c)))
		if err != nil {
			return nil, err
		}
		r := ratio(fmt.Sprintf("checkout with foreign.Limit vs without, concurrency %d", c), once, floor, "/s", 0.5)
		perCall := time.Duration(float64(time.Second) * float64(c) * (1/once - 1/floor))
		r.Note = fmt.Sprintf("floor: the same checkout unpaced; limiter cost ≈ %s per call", perCall.Round(10*time.Microsecond))
		if gaveUp > 0 {
			r.Note += "; " + gaveUpNote(gaveUp)
		}
		results = append(results, r)
	}
	return results, nil
}
