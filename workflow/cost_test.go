package workflow_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/workflow"
)

// keyUpdates returns how many updates of onceflow_keys the server has
// counted, and how many of them were HOT (the row rewritten in place, no
// index entry), once every connection of the pool has published its
// statistics.
func (w *world) keyUpdates() (updates, hot int) {
	w.t.Helper()
	conns := w.db.AcquireAllIdle(w.ctx)
	for _, c := range conns {
		_, err := c.Exec(w.ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(w.t, err)
	}
	for _, c := range conns {
		c.Release()
	}
	require.NoError(w.t, w.db.QueryRow(w.ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
		WHERE relname = 'onceflow_keys' AND schemaname = current_schema()`).Scan(&updates, &hot))
	return updates, hot
}

// TestAdvanceIsAHOTUpdate: a recovery point changes no indexed column of
// the key record, so PostgreSQL rewrites the row in place (migration
// 0016). The checkout writes its record three times: the claim inserts it,
// create_order advances it in the same transaction (HOT), and
// record_charge completes it (not HOT: the status, which the partial
// indexes name, changes).
func TestAdvanceIsAHOTUpdate(t *testing.T) {
	w := newWorld(t)
	e := w.engine(workflow.Config{})
	res, err := w.checkout().Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	updates, hot := w.keyUpdates()
	require.Equal(t, 2, updates, "the advance and the completion")
	require.Equal(t, 1, hot, "the advance is a HOT update")
}
