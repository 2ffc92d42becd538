package routing_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/routing"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// The functions the migrations install run inside the statements that call
// them, so what they read and write must route by tenant too: the claim's
// reads and inserts, the takeover's update, the key lock. Every onceflow
// function the migrated database holds is placed, and its body passes.
func TestFunctionBodiesRouteByTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.NewPool(t, 1)
	rows, err := db.Query(ctx, `SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'public' AND p.proname LIKE 'onceflow\_%' ORDER BY p.proname`)
	require.NoError(t, err)
	bodies := map[string]string{}
	for rows.Next() {
		var name, body string
		require.NoError(t, rows.Scan(&name, &body))
		bodies[name] = body
	}
	require.NoError(t, rows.Err())
	for name := range routing.Functions {
		require.Contains(t, bodies, name, "a placed function the migrations no longer install")
	}
	for name, body := range bodies {
		require.Contains(t, routing.Functions, name, "a migrated function is not placed")
		require.NoError(t, routing.Check(body), name)
	}
}

// A test's own SQL is not onceflow's: a statement a _test.go file sends
// across tenants is not reported.
func TestTestsOwnStatementsAreNotChecked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.NewPool(t, 1)
	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM onceflow_keys WHERE key = $1`, "k").Scan(&n))
	require.Zero(t, n)
}
