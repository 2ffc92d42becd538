package bench

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/workflow"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func benchPool(b testing.TB) *pgxpool.Pool {
	b.Helper()
	db := dbtest.NewPool(b, 8)
	if _, err := db.Exec(context.Background(), ordersTable); err != nil {
		b.Fatal(err)
	}
	return db
}

func runOps(b *testing.B, fn op) {
	b.Helper()
	var i atomic.Int64
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if err := fn(ctx, i.Add(1)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckout runs the checkout workflow and its floor one after
// another: compare the two ns/op.
func BenchmarkCheckout(b *testing.B) {
	db := benchPool(b)
	engine, err := workflow.NewEngine(db, workflow.Config{})
	if err != nil {
		b.Fatal(err)
	}
	wf := checkoutWorkflow()
	b.Run("onceflow", func(b *testing.B) { runOps(b, checkoutOnceflow(engine, wf, "b")) })
	b.Run("floor", func(b *testing.B) { runOps(b, checkoutFloor(db)) })
}

// BenchmarkPacing runs the checkout with its foreign step paced by a Pace
// it never reaches, and without: compare the two ns/op.
func BenchmarkPacing(b *testing.B) {
	db := benchPool(b)
	engine, err := workflow.NewEngine(db, workflow.Config{Pacing: map[string]foreign.Pace{"payments": generousPace}})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("paced", func(b *testing.B) { runOps(b, checkoutOnceflow(engine, pacedCheckoutWorkflow(), "p")) })
	b.Run("unpaced", func(b *testing.B) { runOps(b, checkoutOnceflow(engine, checkoutWorkflow(), "u")) })
}
