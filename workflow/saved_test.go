package workflow_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// TestResumeStoresItsDefinition: a process that only resumes records (a
// completer right after a deploy, before any client's request) stores its
// definition before it stamps or parks a record under it, so that a later
// process can read it and an operator can resume a parked record as it.
func TestResumeStoresItsDefinition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.NewPool(t, 8)
	_, err := db.Exec(ctx, testapp.Schema)
	require.NoError(t, err)
	provider := testapp.NewProvider(t)
	v1 := testapp.Checkout(provider.URL, testapp.Options{})
	crashing, err := workflow.NewEngine(db, workflow.Config{Hooks: &workflow.Hooks{
		CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
			if p == (workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"}) {
				return errors.New("died")
			}
			return nil
		},
	}})
	require.NoError(t, err)
	noop := func(name string) phase.Step[Order, Paid] {
		return phase.Atomic(name, func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil })
	}
	for _, c := range []struct {
		key   string
		steps []phase.Step[Order, Paid]
		err   error
	}{
		{"parks", []phase.Step[Order, Paid]{noop("create_order"), noop("fraud_check"), noop("charge"), noop("record_charge")}, workflow.ErrParked},
		{"restamps", []phase.Step[Order, Paid]{noop("create_order"), phase.Foreign("charge", func(context.Context, *phase.Run[Order, Paid]) error {
			return nil
		}), noop("record_charge"), noop("audit")}, nil},
	} {
		key := workflow.Key{Tenant: "acme", ID: c.key}
		_, err := v1.Run(ctx, crashing, key, Order{Amount: 1})
		require.ErrorIs(t, err, workflow.ErrCrashed)
		_, err = db.Exec(ctx, `UPDATE onceflow_keys SET locked_until = clock_timestamp() - interval '1 second' WHERE key = $1`, c.key)
		require.NoError(t, err)

		v2 := workflow.Define("checkout", c.steps...).Version(c.key)
		e, err := workflow.NewEngine(db, workflow.Config{Workflows: []workflow.Definition{v2}})
		require.NoError(t, err)
		_, err = e.Resume(ctx, key)
		if c.err != nil {
			require.ErrorIs(t, err, c.err, c.key)
		} else {
			require.NoError(t, err, c.key)
		}
		defs, err := e.Store().Definitions(ctx, "checkout", v2.Spec().Fingerprint)
		require.NoError(t, err)
		require.Len(t, defs, 1, "%s: the resuming definition is stored", c.key)
		require.Equal(t, c.key, defs[0].Version)
	}
}
