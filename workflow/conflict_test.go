package workflow_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// TestDeadlockedPhaseRunsAgain: two workflows' atomic phases lock two rows
// in opposite orders, so the database kills one transaction to break the
// deadlock. The victim's phase runs again in a new transaction, from the
// state it started with, and both workflows complete, each write made
// once. Without the re-run, the victim's attempt fails.
func TestDeadlockedPhaseRunsAgain(t *testing.T) {
	w := newWorld(t)
	_, err := w.db.Exec(w.ctx, `CREATE TABLE accounts (id int PRIMARY KEY, moves int NOT NULL);
		INSERT INTO accounts VALUES (1, 0), (2, 0)`)
	require.NoError(t, err)
	var (
		locked sync.WaitGroup // each first try holds its first row
		runs   atomic.Int32
	)
	locked.Add(2)
	move := func(first, second int) phase.Step[Order, Paid] {
		var once sync.Once
		return atomicStep("move", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			runs.Add(1)
			r.State.Status += "moved;"
			if _, err := tx.Exec(ctx, `UPDATE accounts SET moves = moves + 1 WHERE id = $1`, first); err != nil {
				return err
			}
			once.Do(func() { locked.Done(); locked.Wait() })
			_, err := tx.Exec(ctx, `UPDATE accounts SET moves = moves + 1 WHERE id = $1`, second)
			return err
		})
	}
	define := func(name string, first, second int) *workflow.Workflow[Order, Paid] {
		return workflow.Define(name, foreignStep("start", func() error { return nil }), move(first, second))
	}
	a, b := define("a_to_b", 1, 2), define("b_to_a", 2, 1)
	e := w.engine(workflow.Config{})

	results := make([]*workflow.Result, 2)
	errs := make([]error, 2)
	var done sync.WaitGroup
	for i, wf := range []*workflow.Workflow[Order, Paid]{a, b} {
		key := workflow.Key{Tenant: "acme", ID: wf.Name()}
		done.Go(func() { results[i], errs[i] = wf.Run(w.ctx, e, key, order) })
	}
	done.Wait()
	for i := range 2 {
		require.NoError(t, errs[i])
		require.Equal(t, 200, results[i].Response.Status)
		require.JSONEq(t, `{"order_id":0,"status":"moved;"}`, string(results[i].Response.Body), "the retry starts from the state before the phase")
	}
	// The victim's phase ran again (more than once if its second run met
	// the other transaction again).
	require.Greater(t, runs.Load(), int32(2))
	require.Equal(t, 2, w.count(`SELECT moves FROM accounts WHERE id = 1`))
	require.Equal(t, 2, w.count(`SELECT moves FROM accounts WHERE id = 2`))
}
