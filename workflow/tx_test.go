package workflow_test

import (
	"context"
	"errors"
	"fmt"
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
	res, err := wf.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
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
	res, err := wf.Run(w.ctx, w.engine(workflow.Config{}), acme, order)
	require.NoError(t, err)
	require.Equal(t, 200, res.Response.Status)
}

// TestPhaseCannotEndItsTransaction: a statement that would end the phase's
// transaction (COMMIT, END, ROLLBACK, ABORT, PREPARE TRANSACTION, in any
// case, after comments) is refused before it is sent: the phase's writes
// would otherwise commit without the recovery point. A ROLLBACK to a
// savepoint is the phase's own business and goes through.
func TestPhaseCannotEndItsTransaction(t *testing.T) {
	w := newWorld(t)
	refused := []string{"COMMIT", " commit;", "-- done\nCOMMIT", "/* x */ end", "ROLLBACK", "abort work",
		"rollback transaction", "PREPARE TRANSACTION 'x'", "commit and chain"}
	wf := workflow.Define("end_tx",
		phase.Atomic("write", func(ctx context.Context, tx pgx.Tx, _ *phase.Run[Order, Paid]) error {
			if _, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, entry) VALUES (1, 'a')`); err != nil {
				return err
			}
			for _, sql := range refused {
				if _, err := tx.Exec(ctx, sql); err == nil {
					return errors.New("the phase ran " + sql)
				}
				if _, err := tx.Query(ctx, sql); err == nil {
					return errors.New("the phase queried " + sql)
				}
			}
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT onceflow_sp_1`); err != nil {
				return errors.Join(errors.New("a rollback to a savepoint was refused"), err)
			}
			_ = sp
			return workflow.Respond(workflow.Problem(418, "refused"))
		}))
	e := w.engine(workflow.Config{})
	res, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, 418, res.Response.Status, "every ending statement was refused")
	require.Equal(t, 1, w.ledger())
}

// TestPhaseThatEndsItsTransactionFailsTheRecord: a COMMIT the guard cannot
// see (the second statement of a string of several) ends the phase's
// transaction with its writes committed and no recovery point. Running the
// phase again would write twice, so the record fails terminally and no
// retry runs anything; the writes are there once, even when the process
// would have died right after the phase.
//
// Before the fix, the phase's writes were committed, its recovery point
// was not, and the retry after a crash wrote them again.
func TestPhaseThatEndsItsTransactionFailsTheRecord(t *testing.T) {
	w := newWorld(t)
	wf := workflow.Define("sneaky_commit",
		phase.Atomic("write", func(ctx context.Context, tx pgx.Tx, _ *phase.Run[Order, Paid]) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, entry) VALUES (1, 'a'); COMMIT`)
			return err
		}),
		foreignStep("after", func() error { return nil }))
	crashed := true
	e := w.engine(workflow.Config{Hooks: &workflow.Hooks{
		CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
			if crashed && p.Kind == workflow.BeforeCommit {
				return errors.New("process died")
			}
			return nil
		}}})
	res, err := wf.Run(w.ctx, e, acme, order)
	if errors.Is(err, workflow.ErrCrashed) {
		// The attempt got as far as its commit and died there: the retry
		// below takes over.
		require.NoError(t, e.Store().ExpireLease(w.ctx, acme))
	} else {
		require.NoError(t, err)
		require.True(t, res.Failed, "the attempt found its transaction ended and failed the record")
	}
	crashed = false
	res, err = wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.True(t, res.Failed)
	require.Equal(t, 500, res.Response.Status)
	require.Equal(t, 1, w.ledger(), "the phase's write was made once")
}

// restarts are the ways a phase can end its transaction and leave another
// open in its place, so that the connection's status says "in a
// transaction" as before: what the phase wrote first is committed (or, for
// a ROLLBACK, gone) without the recovery point, and in a first phase the
// key's lock went with it. written is how many of the phase's two rows
// are left once the record failed.
var restarts = []struct {
	name, sql string
	written   int
}{
	{"commit and chain", `INSERT INTO ledger (order_id, entry) VALUES (1, 'a'); COMMIT AND CHAIN; INSERT INTO ledger (order_id, entry) VALUES (1, 'b')`, 1},
	{"commit then begin", `INSERT INTO ledger (order_id, entry) VALUES (1, 'a'); COMMIT; BEGIN; INSERT INTO ledger (order_id, entry) VALUES (1, 'b')`, 1},
	{"rollback and chain", `INSERT INTO ledger (order_id, entry) VALUES (1, 'a'); ROLLBACK AND CHAIN; INSERT INTO ledger (order_id, entry) VALUES (1, 'b')`, 0},
	{"end and start", `INSERT INTO ledger (order_id, entry) VALUES (1, 'a'); END; START TRANSACTION; INSERT INTO ledger (order_id, entry) VALUES (1, 'b')`, 1},
}

// TestPhaseThatRestartsItsTransactionFailsTheRecord: a phase restarts its
// transaction inside a string of statements (COMMIT AND CHAIN, COMMIT;
// BEGIN, ROLLBACK AND CHAIN). The attempt finds it before its commit,
// before the crash point there, and fails the record terminally: no retry
// runs the phase again, so what it committed is there once, and the second
// row, written in the transaction that replaced the phase's, is never
// committed. First phase (opened with the claim) and later phase alike.
//
// Before the fix, only a transaction left idle (status I) was seen: with a
// process dying before its commit, the retry wrote the rows again; with
// ROLLBACK AND CHAIN, the first row was lost and the key answered 200.
func TestPhaseThatRestartsItsTransactionFailsTheRecord(t *testing.T) {
	t.Parallel()
	for _, r := range restarts {
		for _, first := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/first=%v", r.name, first), func(t *testing.T) {
				w := newWorld(t)
				restart := atomicStep("write", func(ctx context.Context, tx pgx.Tx, _ *phase.Run[Order, Paid]) error {
					_, err := tx.Exec(ctx, r.sql)
					return err
				})
				steps := []phase.Step[Order, Paid]{restart, foreignStep("after", func() error { return nil })}
				if !first {
					steps = append([]phase.Step[Order, Paid]{foreignStep("before", func() error { return nil })}, steps...)
				}
				wf := workflow.Define("restarts", steps...)
				crashes := 0
				e := w.engine(workflow.Config{Hooks: &workflow.Hooks{
					CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
						if p.Kind == workflow.BeforeCommit && p.Step == "write" {
							crashes++
							return errors.New("process died")
						}
						return nil
					}}})
				res, err := wf.Run(w.ctx, e, acme, order)
				require.NoError(t, err, "the attempt found its transaction restarted before its commit")
				require.True(t, res.Failed)
				require.Zero(t, crashes)
				again, err := wf.Run(w.ctx, e, acme, order)
				require.NoError(t, err)
				require.True(t, again.Replayed)
				require.Equal(t, 500, again.Response.Status)
				require.Equal(t, r.written, w.ledger(), "the phase's first row as its own COMMIT left it, and nothing of the transaction after")
				require.Contains(t, w.record(acme).LastError, "ended or restarted")
			})
		}
	}
}

// TestPhaseThatRestartsItsTransactionUnseenFailsAtCommit: a restart the
// attempt cannot see before its commit (a string of statements sent on
// the simple protocol with arguments, or on the raw connection) is found
// by the commit's check of the transaction's mark: the COMMIT behind it
// does not run, so the second row is not committed without the recovery
// point, and the record fails terminally.
//
// Before the fix, the engine's COMMIT committed the transaction that
// replaced the phase's, with the recovery point, as if nothing happened.
func TestPhaseThatRestartsItsTransactionUnseenFailsAtCommit(t *testing.T) {
	t.Parallel()
	sends := map[string]func(ctx context.Context, tx pgx.Tx) error{
		"simple protocol": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, entry) VALUES ($1, 'a'); COMMIT AND CHAIN; INSERT INTO ledger (order_id, entry) VALUES (1, 'b')`,
				pgx.QueryExecModeSimpleProtocol, 1)
			return err
		},
		"raw connection": func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, entry) VALUES ($1, 'a')`, 1); err != nil {
				return err
			}
			_, err := tx.Conn().Exec(ctx, `COMMIT AND CHAIN; INSERT INTO ledger (order_id, entry) VALUES (1, 'b')`)
			return err
		},
	}
	for name, send := range sends {
		for _, first := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/first=%v", name, first), func(t *testing.T) {
				w := newWorld(t)
				restart := atomicStep("write", func(ctx context.Context, tx pgx.Tx, _ *phase.Run[Order, Paid]) error {
					return send(ctx, tx)
				})
				steps := []phase.Step[Order, Paid]{restart, foreignStep("after", func() error { return nil })}
				if !first {
					steps = append([]phase.Step[Order, Paid]{foreignStep("before", func() error { return nil })}, steps...)
				}
				res, err := workflow.Define("restarts", steps...).Run(w.ctx, w.engine(workflow.Config{}), acme, order)
				require.NoError(t, err)
				require.True(t, res.Failed)
				require.Equal(t, 500, res.Response.Status)
				require.Equal(t, 1, w.ledger(), "the row the phase's own COMMIT committed, not the one after it")
				require.Contains(t, w.record(acme).LastError, "ended or restarted")
			})
		}
	}
}
