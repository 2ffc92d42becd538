package workflow_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// TestReadOnlyServerResetsThePool: a pool whose connections are on a
// read-only server (a standby, where a failover left them) gets SQLSTATE
// 25006 on the first write. The run fails as unavailable (HTTP 503), runs
// nothing, and the engine closes the pool's connections, so that once the
// database takes writes again (the pool's next connections reach the new
// primary) the retry succeeds with the same pool, no restart.
//
// It connects straight to PostgreSQL: behind PgBouncer, the server
// sessions are PgBouncer's, which the app's pool cannot reset.
func TestReadOnlyServerResetsThePool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.DirectURL(t, dbtest.NewDatabase(t, dbtest.Options{}))
	setup := dbtest.Connect(t, url, 1)
	_, err := setup.Exec(ctx, testapp.Schema)
	require.NoError(t, err)
	setup.Close()

	dbtest.SetReadOnly(t, url, true)
	db := dbtest.Connect(t, url, 2) // every connection made read-only
	e, err := workflow.NewEngine(db, workflow.Config{})
	require.NoError(t, err)
	w := &world{t: t, ctx: ctx, db: db, provider: testapp.NewProvider(t)}
	wf := w.checkout()

	_, err = wf.Run(ctx, e, acme, order)
	require.Error(t, err)
	require.True(t, recovery.ReadOnly(err), "25006: %v", err)
	require.True(t, recovery.Unavailable(err), "answered 503: %v", err)
	require.Zero(t, w.provider.Effects("charges"), "nothing ran")

	dbtest.SetReadOnly(t, url, false) // the new primary
	res, err := wf.Run(ctx, e, acme, order)
	require.NoError(t, err, "a connection still on the read-only server was reused")
	require.False(t, res.Replayed)
	require.Equal(t, 1, w.provider.Effects("charges"))
}
