package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/recovery"
)

// TestCheck: an unmigrated and a half-migrated schema are NotMigratedError,
// whose message names the schema and the command; a migrated one passes,
// and Check creates nothing.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newEmpty(t)
	m, err := migrations.New(db, migrations.Config{Schema: "billing"})
	require.NoError(t, err)

	err = m.Check(ctx)
	require.ErrorIs(t, err, recovery.ErrNotMigrated)
	var notMigrated *recovery.NotMigratedError
	require.ErrorAs(t, err, &notMigrated)
	require.Equal(t, "billing", notMigrated.Schema)
	require.ErrorContains(t, err, `schema "billing"`)
	require.ErrorContains(t, err, "onceflow migrate up --schema billing")
	require.ErrorContains(t, err, "at version 0")
	require.False(t, tableExists(t, db, "billing.onceflow_migrations"), "Check must not create anything")

	_, err = m.To(ctx, migrations.Latest()-1)
	require.NoError(t, err)
	require.ErrorIs(t, m.Check(ctx), recovery.ErrNotMigrated, "a schema one migration behind")

	_, err = m.Up(ctx)
	require.NoError(t, err)
	require.NoError(t, m.Check(ctx))
}
