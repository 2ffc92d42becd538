package workflow_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// TestPhaseTransactionBehavesLikePgxTx: what a phase can do with its
// transaction, in the first phase (opened with the claim) and in a later
// one (whose BEGIN goes with the first statement).
func TestPhaseTransactionBehavesLikePgxTx(t *testing.T) {
	w := newWorld(t)
	exercise := func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
		// A multi-statement string without arguments goes as one simple query.
		if _, err := tx.Exec(ctx, `DELETE FROM ledger WHERE entry = 'b'; INSERT INTO ledger (order_id, entry) VALUES (1, 'a'); INSERT INTO ledger (order_id, entry) VALUES (1, 'b')`); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE entry = $1`, "b").Scan(&n); err != nil || n != 1 {
			return errors.Join(err, errors.New("the phase does not see its own write"))
		}
		// A savepoint rolled back undoes only what came after it.
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, `INSERT INTO ledger (order_id, entry) VALUES ($1, 'undone')`, 1); err != nil {
			return err
		}
		if err := sp.Rollback(ctx); err != nil {
			return err
		}
		require.ErrorIs(t, sp.Commit(ctx), pgx.ErrTxClosed)
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO ledger (order_id, entry) VALUES ($1, 'batched')`, 1)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"ledger"}, []string{"order_id", "entry"},
			pgx.CopyFromRows([][]any{{int64(1), "copied"}})); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT entry FROM ledger ORDER BY id`)
		if err != nil {
			return err
		}
		entries, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		require.Equal(t, []string{"a", "b", "batched", "copied"}, entries[len(entries)-4:])
		require.Error(t, tx.Commit(ctx), "the engine ends a phase's transaction")
		require.Error(t, tx.Rollback(ctx))
		require.NotNil(t, tx.Conn())
		return nil
	}
	firstRow := func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
		// A later phase whose first statement is a QueryRow with arguments:
		// the BEGIN goes with it.
		var entry string
		if err := tx.QueryRow(ctx, `SELECT entry FROM ledger WHERE entry = $1`, "copied").Scan(&entry); err != nil {
			return err
		}
		return exercise(ctx, tx, r)
	}
	wf := workflow.Define("tx", atomicStep("first", exercise), foreignStep("call", func() error { return nil }),
		atomicStep("second", firstRow), atomicStep("third", exercise))
	res, err := w.engine(workflow.Config{}).Run(w.ctx, acme, wf, order)
	require.NoError(t, err)
	require.Equal(t, 200, res.Response.Status)
	require.Equal(t, 10, w.ledger(), "each exercising phase committed its rows; the second deleted the first's 'b'")
	require.Zero(t, w.count(`SELECT count(*) FROM ledger WHERE entry = 'undone'`))
}

// TestPhaseThatWritesNothing: a later phase that sends no statement still
// opens and commits its transaction with the recovery point.
func TestPhaseThatWritesNothing(t *testing.T) {
	w := newWorld(t)
	idle := func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil }
	wf := workflow.Define("idle", foreignStep("call", func() error { return nil }), atomicStep("nothing", idle),
		atomicStep("nothing_either", idle))
	res, err := w.engine(workflow.Config{}).Run(w.ctx, acme, wf, order)
	require.NoError(t, err)
	require.Equal(t, 200, res.Response.Status)
}
