package workflow_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// TestPhaseTxUsedAfterThePhaseReturnedIsRefused: an atomic phase's tx
// (an opentx.Tx on the attempt's *pgx.Conn) kept past the phase's return
// (a goroutine the phase started) is never closed. Once the engine commits
// the phase and the connection goes back to the pool, a late statement
// through it runs, without error, in whatever transaction is open there:
// here another key's first phase, whose record it then commits with. The
// same root cause as idemhttp's TestTxUsedAfterTheHandlerReturnedIsRefused;
// pgx's own Tx would answer pgx.ErrTxClosed.
func TestPhaseTxUsedAfterThePhaseReturnedIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	db := dbtest.Connect(t, url, 1) // one connection: key b's phase gets key a's
	check := dbtest.Connect(t, url, 1)
	_, err := check.Exec(ctx, testapp.Schema)
	require.NoError(t, err)
	e, err := workflow.NewEngine(db, workflow.Config{})
	require.NoError(t, err)

	late, lateErr := make(chan struct{}), make(chan error, 1)
	inB, lateDone := make(chan struct{}), make(chan struct{})
	wf := workflow.Define("stale_tx",
		atomicStep("write", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			if r.Key.ID == "a" {
				go func() { // keeps tx past the phase's return
					<-late
					_, err := tx.Exec(context.Background(), `INSERT INTO ledger (order_id, entry) VALUES (0, 'a, late')`)
					lateErr <- err
				}()
				return nil
			}
			close(inB) // b's first transaction is open on the pool's one connection
			<-lateDone
			return nil
		}),
	).Finish(func(*Paid) workflow.Response { return workflow.JSON(201, nil) })

	_, err = wf.Run(ctx, e, workflow.Key{Tenant: "acme", ID: "a"}, order)
	require.NoError(t, err)
	b := make(chan error, 1)
	go func() { _, err := wf.Run(ctx, e, workflow.Key{Tenant: "acme", ID: "b"}, order); b <- err }()
	<-inB
	close(late)
	lateWriteErr := <-lateErr
	close(lateDone)
	require.NoError(t, <-b)

	var lateRows int
	require.NoError(t, check.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE entry = 'a, late'`).Scan(&lateRows))
	require.Zero(t, lateRows, "key a's late write was committed by key b's first phase")
	require.Error(t, lateWriteErr, "a's tx was used after its phase returned and nothing refused it")
}
