package workflow_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
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

// TestAnotherDatabaseReadOnlyKeepsThePool: a foreign step that writes to
// another database, which refuses the write as read-only (a replica, a
// database in maintenance), failed for want of that database: the
// engine's own connections are on its primary, and resetting them on
// every such failure would close and reopen the pool at each request. The
// next run reuses the engine's connections.
func TestAnotherDatabaseReadOnlyKeepsThePool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.NewPool(t, 2)
	otherURL := dbtest.DirectURL(t, dbtest.NewDatabase(t, dbtest.Options{}))
	dbtest.SetReadOnly(t, otherURL, true)
	other := dbtest.Connect(t, otherURL, 1)
	var refuse atomic.Bool
	wf := workflow.Define("replicate",
		phase.Foreign("copy", func(ctx context.Context, r *phase.Run[Order, Paid]) error {
			if !refuse.Load() {
				return nil
			}
			_, err := other.Exec(ctx, `CREATE TABLE copies (id int)`)
			return err
		}),
	).Finish(func(*Paid) workflow.Response { return workflow.JSON(200, nil) })
	e, err := workflow.NewEngine(db, workflow.Config{})
	require.NoError(t, err)
	_, err = wf.Run(ctx, e, workflow.Key{Tenant: "acme", ID: "warm"}, order)
	require.NoError(t, err)
	made := db.Stat().NewConnsCount()

	refuse.Store(true)
	_, err = wf.Run(ctx, e, workflow.Key{Tenant: "acme", ID: "k1"}, order)
	require.True(t, recovery.ReadOnly(err), "25006 from the other database: %v", err)
	refuse.Store(false)
	_, err = wf.Run(ctx, e, workflow.Key{Tenant: "acme", ID: "k1"}, order)
	require.NoError(t, err)
	require.Equal(t, made, db.Stat().NewConnsCount(), "the engine's pool was reset for another database's refusal")
}

// TestReadOnlyServerResetsThePoolWhenTheFirstPhaseHidesTheError:
// TestReadOnlyServerResetsThePool with a first atomic phase that reports
// its write's failure in words of its own (fmt.Errorf with %v, a
// validation error, a domain error), as many do. Until migration 0019 the
// claim folded into that phase inserted the record, and its 25006 reset
// the pool whatever the phase did. Now the claim writes nothing for a new
// key (it reads and takes the advisory lock, both allowed on a standby),
// the phase's own 25006 is the only refusal, and the engine's re-claim
// after the rollback, which does hit 25006, swallows it
// (recordAfterRollback). The run is a 500-class step error, not
// unavailable, and the pool stays on the read-only server: the retry once
// the database takes writes again fails too.
func TestReadOnlyServerResetsThePoolWhenTheFirstPhaseHidesTheError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.DirectURL(t, dbtest.NewDatabase(t, dbtest.Options{}))
	setup := dbtest.Connect(t, url, 1)
	_, err := setup.Exec(ctx, testapp.Schema)
	require.NoError(t, err)
	setup.Close()

	db := dbtest.Connect(t, url, 2)
	e, err := workflow.NewEngine(db, workflow.Config{})
	require.NoError(t, err)
	wf := workflow.Define("create_only",
		atomicStep("create_order", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			if err := tx.QueryRow(ctx, `INSERT INTO orders (tenant, key, customer, amount, status) VALUES ($1, $2, $3, $4, 'created') RETURNING id`,
				r.Key.Tenant, r.Key.ID, r.Request.Customer, r.Request.Amount).Scan(&r.State.OrderID); err != nil {
				return fmt.Errorf("could not create the order: %v", err)
			}
			return nil
		}),
		foreignStep("notify", func() error { return nil }),
	).Finish(func(*Paid) workflow.Response { return workflow.JSON(201, nil) })

	_, err = wf.Run(ctx, e, workflow.Key{Tenant: "acme", ID: "before-the-failover"}, order)
	require.NoError(t, err) // the definition is saved, as in a process that ran before the failover

	dbtest.SetReadOnly(t, url, true)
	db.Reset() // the pool's connections now land on a "standby"
	_, err = wf.Run(ctx, e, acme, order)
	require.Error(t, err)
	assert.True(t, recovery.Unavailable(err), "answered 503, the pool reset: %v", err)

	dbtest.SetReadOnly(t, url, false) // the new primary
	_, err = wf.Run(ctx, e, acme, order)
	require.NoError(t, err, "a connection still on the read-only server was reused")
}
