package sweeper_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/sweeper"
	"github.com/onceflow/onceflow/workflow"
)

// TestCompleterWaitsForADeferral: a record whose step deferred it is not
// due before its not-before time, even with no backoff: the completer's
// query leaves it out and a run resumes nothing. Once the time has passed,
// the next run finishes it.
func TestCompleterWaitsForADeferral(t *testing.T) {
	b := setup(t)
	deferring := testapp.Checkout(b.provider.URL, testapp.Options{Before: func(_ context.Context, step string) error {
		if step == "charge" {
			return phase.Defer(time.Hour, errors.New("provider answered 429"))
		}
		return nil
	}})
	e, err := workflow.NewEngine(b.db, workflow.Config{})
	require.NoError(t, err)
	key := workflow.Key{Tenant: "acme", ID: "deferred"}
	_, err = deferring.Run(b.ctx, e, key, Order{Amount: 100})
	var deferErr *phase.DeferError
	require.ErrorAs(t, err, &deferErr)

	engine, err := workflow.NewEngine(b.db, workflow.Config{Workflows: []workflow.Definition{b.checkout}})
	require.NoError(t, err)
	completer, err := sweeper.NewCompleter(b.db, engine, sweeper.CompleterConfig{BackoffBase: -1})
	require.NoError(t, err)
	due := func() []string {
		rows, err := b.db.Query(b.ctx, `SELECT key FROM (`+sweeper.DueSQL+`) due`, []string{"checkout"}, int64(0), int64(0), 100)
		require.NoError(t, err)
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return keys
	}
	require.Empty(t, due(), "a deferred record is not due")
	require.NoError(t, completer.Run(b.ctx))
	rec, err := engine.Store().Load(b.ctx, key)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusInFlight, rec.Status)
	require.False(t, rec.NotBefore.IsZero())
	require.Zero(t, b.provider.Effects("charges"))

	_, err = b.db.Exec(b.ctx, `UPDATE onceflow_keys SET not_before = clock_timestamp() - interval '1 millisecond'`)
	require.NoError(t, err)
	require.Equal(t, []string{key.ID}, due())
	require.NoError(t, completer.Run(b.ctx))
	rec, err = engine.Store().Load(b.ctx, key)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusCompleted, rec.Status)
	require.Equal(t, 1, b.provider.Effects("charges"))
}
