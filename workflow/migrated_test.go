package workflow_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// TestNotMigrated: on a database nobody migrated, Run and Resume fail with
// ErrNotMigrated, naming the command, and run nothing.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	w := newWorldOn(t, dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true}))
	wf := w.checkout()
	e := w.engine(workflow.Config{Workflows: []workflow.Definition{wf}})

	_, err := wf.Run(w.ctx, e, acme, order)
	require.ErrorIs(t, err, workflow.ErrNotMigrated)
	require.ErrorContains(t, err, "onceflow migrate up")
	require.Zero(t, w.orders())
	_, err = e.Resume(w.ctx, acme)
	require.ErrorIs(t, err, workflow.ErrNotMigrated)
}

// TestApplicationsMissingTable: a step's own statement on a table that does
// not exist is the step's error, not ErrNotMigrated: only onceflow's
// statements say anything about its migrations.
func TestApplicationsMissingTable(t *testing.T) {
	w := newWorld(t)
	wf := workflow.Define("missing", atomicStep("read", func(ctx context.Context, tx pgx.Tx, _ *phase.Run[Order, Paid]) error {
		_, err := tx.Exec(ctx, `SELECT FROM no_such_table`)
		return err
	})).Finish(func(*Paid) workflow.Response { return workflow.JSON(200, nil) })
	e := w.engine(workflow.Config{})
	_, err := wf.Run(w.ctx, e, acme, order)
	var stepErr *workflow.StepError
	require.ErrorAs(t, err, &stepErr)
	require.NotErrorIs(t, err, workflow.ErrNotMigrated)
}
