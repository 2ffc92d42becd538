package workflow_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// keyWrites returns how many rows of onceflow_keys the server has counted
// inserted and updated, and how many of the updates were HOT (the row
// rewritten in place, no index entry), once every connection of the pool
// has published its statistics.
func (w *world) keyWrites() (inserts, updates, hot int) {
	w.t.Helper()
	conns := w.db.AcquireAllIdle(w.ctx)
	for _, c := range conns {
		_, err := c.Exec(w.ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(w.t, err)
	}
	for _, c := range conns {
		c.Release()
	}
	require.NoError(w.t, w.db.QueryRow(w.ctx, `SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
		WHERE relname = 'onceflow_keys' AND schemaname = current_schema()`).Scan(&inserts, &updates, &hot))
	return inserts, updates, hot
}

// TestFirstPhaseWritesTheRecordOnce: the claim folded into the first
// phase's transaction leaves the new record to that phase's recovery
// point, which inserts it (migration 0019): the checkout writes its record
// twice, an insert with create_order's recovery point and the completion,
// where an insert by the claim and an update by the recovery point, in
// one transaction, made two versions of the row.
func TestFirstPhaseWritesTheRecordOnce(t *testing.T) {
	w := newWorld(t)
	e := w.engine(workflow.Config{})
	res, err := w.checkout().Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	inserts, updates, _ := w.keyWrites()
	require.Equal(t, 1, inserts, "the first phase's recovery point")
	require.Equal(t, 1, updates, "the completion")
	rec, err := e.Store().Load(w.ctx, acme)
	require.NoError(t, err)
	kinds := []recovery.TransitionKind{}
	for _, tr := range rec.History {
		kinds = append(kinds, tr.Kind)
	}
	require.Equal(t, []recovery.TransitionKind{recovery.TransitionClaimed, recovery.TransitionPhaseCommitted,
		recovery.TransitionCompleted}, kinds)
	require.False(t, rec.History[0].At.Before(rec.CreatedAt), "created by the claim")
	require.True(t, rec.History[0].At.Before(rec.History[1].At), "claimed when the claim ran, before the phase committed")
	require.Equal(t, res.Response.Body, rec.Response.Body)
}

// TestAdvanceIsAHOTUpdate: a recovery point changes no indexed column of
// the key record, so PostgreSQL rewrites the row in place (migration
// 0016). The ledger inserts its record with create_order's recovery point,
// advances it on its own after charge and with record_charge (both HOT),
// and completes it with close (not HOT: the status, which the partial
// indexes name, changes).
func TestAdvanceIsAHOTUpdate(t *testing.T) {
	w := newWorld(t)
	e := w.engine(workflow.Config{})
	res, err := newEffects(w).ledger().Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	inserts, updates, hot := w.keyWrites()
	require.Equal(t, 1, inserts, "the first phase's recovery point")
	require.Equal(t, 3, updates, "two advances and the completion")
	require.Equal(t, 2, hot, "the advances are HOT updates")
}

// TestReplaysInAStreamTakeOneRoundTripEach: a replay's claim opens the
// first phase's transaction, which it leaves open for the next claim to
// end in its own batch (keptConn): a stream of replays costs one round
// trip each, not a claim and a ROLLBACK. Left alone, the kept connection
// goes back to the pool.
func TestReplaysInAStreamTakeOneRoundTripEach(t *testing.T) {
	w := newWorld(t)
	e := w.engine(workflow.Config{})
	wf := w.checkout()
	first, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	w.settled()

	workflow.SetKeptFor(e, time.Minute) // no expiry between the replays, however slow the machine
	before := w.counter.Counts()
	const replays = 10
	for range replays {
		res, err := wf.Run(w.ctx, e, acme, order)
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, first.Response.Body, res.Response.Body)
	}
	got := w.counter.Counts().Sub(before)
	require.EqualValues(t, replays, got.RoundTrips(), "%+v", got)
	require.EqualValues(t, 1, w.db.Stat().AcquiredConns(), "the last replay's connection is kept")

	// The next claim, a new key's, ends the kept transaction in its batch.
	_, err = wf.Run(w.ctx, e, workflow.Key{Tenant: "acme", ID: "next"}, order)
	require.NoError(t, err)
	require.Zero(t, w.db.Stat().AcquiredConns())
	workflow.SetKeptFor(e, 0)

	_, err = wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	w.settled() // within keptFor, the connection goes back by itself
}
