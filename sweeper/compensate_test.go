package sweeper_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/sweeper"
	"github.com/onceflow/onceflow/workflow"
)

// TestCompleterFinishesACompensation: the refund of a workflow that failed
// for good failed too, and its client went away. The record is in flight
// and compensating; a completer run takes it over and finishes the refund
// with the same key, and the record ends compensated.
func TestCompleterFinishesACompensation(t *testing.T) {
	b := setup(t)
	refund := foreign.Compensate(func(ctx context.Context, c *foreign.Call[Order, State]) error {
		_, err := testapp.Call(ctx, b.provider.URL, "refunds", c.Key)
		return err
	})
	saga := workflow.Define("saga",
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[Order, State]) error {
			_, err := testapp.Call(ctx, b.provider.URL, "charges", c.Key)
			return err
		}, refund),
		phase.Atomic("record", func(context.Context, pgx.Tx, *phase.Run[Order, State]) error {
			return phase.Permanent(errors.New("the order cannot be recorded"))
		}),
	)
	engine, err := workflow.NewEngine(b.db, workflow.Config{Workflows: []workflow.Definition{saga}})
	require.NoError(t, err)
	b.provider.Fail("refunds", testapp.Fault{Status: 503})
	key := workflow.Key{Tenant: "acme", ID: "refund-pending"}
	_, err = saga.Run(b.ctx, engine, key, Order{Amount: 100})
	require.Error(t, err)
	rec, err := engine.Store().Load(b.ctx, key)
	require.NoError(t, err)
	require.True(t, rec.Compensating())

	completer, err := sweeper.NewCompleter(b.db, engine, sweeper.CompleterConfig{BackoffBase: -1})
	require.NoError(t, err)
	require.NoError(t, completer.Run(b.ctx))
	rec, err = engine.Store().Load(b.ctx, key)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusCompensated, rec.Status)
	require.Equal(t, 1, b.provider.Effects("charges"))
	require.Equal(t, 1, b.provider.Effects("refunds"))
	require.Equal(t, 2, b.provider.MaxCalls("refunds"), "the completer refunds with the same key")
}
