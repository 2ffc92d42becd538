package recovery_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/recovery"
)

// TestNotMigrated: on a database without onceflow's tables, with an older
// claim function, or without a column this build reads, the store's
// statements fail with ErrNotMigrated, naming the schema and the command,
// instead of a bare SQLSTATE.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	key := recovery.Key{Tenant: "t", ID: "k"}
	requireNotMigrated := func(t *testing.T, b *bundle, schema string) {
		t.Helper()
		_, _, err := b.store.Claim(ctx, params(t, key, `{}`))
		require.ErrorIs(t, err, recovery.ErrNotMigrated)
		var notMigrated *recovery.NotMigratedError
		require.ErrorAs(t, err, &notMigrated)
		require.Equal(t, schema, notMigrated.Schema)
		require.ErrorContains(t, err, "onceflow migrate up")
	}

	t.Run("unmigrated", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true}), 4))
		requireNotMigrated(t, b, "public")
		_, err := b.store.Load(ctx, key)
		require.ErrorIs(t, err, recovery.ErrNotMigrated)
		_, err = b.store.List(ctx, recovery.ListFilter{})
		require.ErrorIs(t, err, recovery.ErrNotMigrated)
		_, _, err = seam.StoreOf(b.store).Takeover(ctx, key, "checkout")
		require.ErrorIs(t, err, recovery.ErrNotMigrated)
	})
	t.Run("older claim function", func(t *testing.T) {
		t.Parallel()
		db := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true}), 4)
		m, err := migrations.New(db, migrations.Config{})
		require.NoError(t, err)
		_, err = m.To(ctx, 7) // before the claim took a principal (0008)
		require.NoError(t, err)
		requireNotMigrated(t, setupWith(t, db), "public")
	})
	t.Run("no takeover function", func(t *testing.T) {
		t.Parallel()
		db := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true}), 4)
		m, err := migrations.New(db, migrations.Config{})
		require.NoError(t, err)
		_, err = m.To(ctx, 8) // before the takeover rule was a function (0009)
		require.NoError(t, err)
		_, _, err = seam.StoreOf(setupWith(t, db).store).Takeover(ctx, key, "checkout")
		require.ErrorIs(t, err, recovery.ErrNotMigrated)
		require.ErrorContains(t, err, "onceflow migrate up")
	})
	t.Run("missing column", func(t *testing.T) {
		b := setup(t)
		_, err := b.db.Exec(ctx, `ALTER TABLE onceflow_keys DROP COLUMN principal_hash`)
		require.NoError(t, err)
		requireNotMigrated(t, b, "public")
	})
	t.Run("other schema", func(t *testing.T) {
		t.Parallel()
		db := dbtest.NewPool(t, 4)
		store, err := recovery.New(db, recovery.Config{Schema: "billing"})
		require.NoError(t, err)
		_, _, err = store.Claim(ctx, params(t, key, `{}`))
		require.ErrorContains(t, err, `in schema "billing": run `+"`onceflow migrate up --schema billing`")
	})
	t.Run("other errors", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, context.Canceled, recovery.NotMigrated("public", context.Canceled))
		require.NoError(t, recovery.NotMigrated("public", nil))
	})
}
