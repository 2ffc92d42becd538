package sweeper_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/sweeper"
	"github.com/onceflow/onceflow/workflow"
)

// TestCompleterTakesTheEnginesSchema: a completer built from an engine
// reads the engine's schema, told once: with CompleterConfig.Schema left
// empty it finds a stuck record in the engine's schema (not in "public"),
// and another schema is refused rather than used.
func TestCompleterTakesTheEnginesSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true}), 4)
	m, err := migrations.New(db, migrations.Config{Schema: "billing"})
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	engine, err := workflow.NewEngine(db, workflow.Config{Schema: "billing", Workflows: []workflow.Definition{poison}})
	require.NoError(t, err)

	_, err = sweeper.NewCompleter(db, engine, sweeper.CompleterConfig{Schema: "public"})
	require.ErrorContains(t, err, `the engine's schema is "billing"`)

	key := workflow.Key{Tenant: "acme", ID: "stuck"}
	_, err = poison.Run(ctx, engine, key, Order{})
	require.ErrorContains(t, err, "always fails")
	completer, err := sweeper.NewCompleter(db, engine, sweeper.CompleterConfig{BackoffBase: -1})
	require.NoError(t, err)
	require.NoError(t, completer.Run(ctx), "the run reads billing (public holds no onceflow tables)")
	rec, err := engine.Store().Load(ctx, key)
	require.NoError(t, err)
	require.Equal(t, 2, rec.Attempts, "the completer resumed the engine's record in billing")
}
