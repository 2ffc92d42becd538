package sweeper_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/sweeper"
)

// TestNotMigrated: on a database nobody migrated, the pruner and the
// completer fail with recovery.ErrNotMigrated, which names the command.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true}), 2)
	pruner, err := sweeper.NewPruner(db, sweeper.PrunerConfig{})
	require.NoError(t, err)
	err = pruner.Run(ctx)
	require.ErrorIs(t, err, recovery.ErrNotMigrated)
	require.ErrorContains(t, err, "onceflow migrate up")

	reporter, err := sweeper.NewCompleter(db, nil, sweeper.CompleterConfig{Schema: "billing"})
	require.NoError(t, err)
	err = reporter.Run(ctx)
	require.ErrorIs(t, err, recovery.ErrNotMigrated)
	require.ErrorContains(t, err, "onceflow migrate up --schema billing")
}
