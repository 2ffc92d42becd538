package dbtest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { Main(m) }

func TestDatabasesAreMigratedAndIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := NewPool(t, 2), NewPool(t, 2)
	_, err := a.Exec(ctx, `INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, owner, locked_until)
		VALUES ('t', 'k', gen_random_uuid(), 'w', decode(repeat('00', 32), 'hex'), gen_random_uuid(), now())`)
	require.NoError(t, err, "the template is migrated")
	var inA, inB int
	require.NoError(t, a.QueryRow(ctx, `SELECT count(*) FROM onceflow_keys`).Scan(&inA))
	require.NoError(t, b.QueryRow(ctx, `SELECT count(*) FROM onceflow_keys`).Scan(&inB))
	require.Equal(t, 1, inA)
	require.Zero(t, inB, "another test's database does not see the row")

	empty := Connect(t, NewDatabase(t, Options{Unmigrated: true}), 1)
	var exists bool
	require.NoError(t, empty.QueryRow(ctx, `SELECT to_regclass('onceflow_keys') IS NOT NULL`).Scan(&exists))
	require.False(t, exists)
}

func TestDatabaseURL(t *testing.T) {
	t.Parallel()
	require.Equal(t, "postgres://u:p@h:5/other?sslmode=disable", databaseURL("postgres://u:p@h:5/postgres?sslmode=disable", "other"))
	require.Equal(t, "host=h user=u dbname=other", databaseURL("host=h user=u", "other"))
	require.Equal(t, "postgres://u:xxxxx@h/db", redact("postgres://u:secret@h/db"))
	require.Equal(t, "postgres:///db?host=/run", redact("postgres:///db?host=/run"))
	require.Equal(t, "the database server", redact("host=h password=secret"))
}
