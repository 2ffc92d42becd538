package workflow_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// TestContendedClaimRetriesOnceAndCountsNothing: a folded claim
// (the first step is atomic) that waits out the claim's lock_timeout tries
// once more in a new transaction. While another session holds the key's
// row, both tries time out: Run answers in flight (Contended), nothing
// runs, the record is untouched (no attempt counted, no second record), and
// the attempt holds no connection afterwards. Once the row is free, the
// next Run owns the key and counts only what the record's history says.
func TestContendedClaimRetriesOnceAndCountsNothing(t *testing.T) {
	w := newWorld(t)
	var ran atomic.Int32
	wf := workflow.Define("contended_count",
		phase.Atomic("count", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error {
			ran.Add(1)
			return nil
		}))
	e := w.engine(workflow.Config{})
	body, err := json.Marshal(order)
	require.NoError(t, err)
	fp, canon, err := recovery.FingerprintJSON("contended_count", body)
	require.NoError(t, err)
	attempts := func(key workflow.Key) int {
		var n int
		require.NoError(t, w.db.QueryRow(w.ctx, `SELECT attempts FROM onceflow_keys WHERE tenant_id = $1 AND key = $2`,
			key.Tenant, key.ID).Scan(&n))
		return n
	}
	contended := func(t *testing.T, key workflow.Key) {
		t.Helper()
		_, err := wf.Run(w.ctx, e, key, order)
		var inFlight *recovery.InFlightError
		require.ErrorAs(t, err, &inFlight)
		require.True(t, inFlight.Contended)
		require.EqualValues(t, 1, w.db.Stat().AcquiredConns(), "the attempt handed its connections back; the holder keeps one")
	}

	t.Run("expired lease held by another session", func(t *testing.T) {
		key := workflow.Key{Tenant: "acme", ID: "held-expired"}
		_, _, err := e.Store().Claim(w.ctx, recovery.ClaimParams{Key: key, Workflow: "contended_count", Fingerprint: fp, Request: canon})
		require.NoError(t, err)
		require.NoError(t, e.Store().ExpireLease(w.ctx, key))
		holder, err := w.db.Begin(w.ctx)
		require.NoError(t, err)
		defer func() { _ = holder.Rollback(w.ctx) }()
		_, err = holder.Exec(w.ctx, `SELECT 1 FROM onceflow_keys WHERE tenant_id = $1 AND key = $2 FOR UPDATE`, key.Tenant, key.ID)
		require.NoError(t, err)
		contended(t, key)
		require.Zero(t, attempts(key), "a timed-out takeover counts no attempt")
		require.NoError(t, holder.Rollback(w.ctx))

		res, err := wf.Run(w.ctx, e, key, order)
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.Equal(t, 1, attempts(key), "the abandoned lease, once")
	})

	t.Run("uncommitted first claim", func(t *testing.T) {
		key := workflow.Key{Tenant: "acme", ID: "held-new"}
		holder, err := w.db.Begin(w.ctx)
		require.NoError(t, err)
		defer func() { _ = holder.Rollback(w.ctx) }()
		_, _, err = e.Store().WithTx(holder).Claim(w.ctx, recovery.ClaimParams{Key: key, Workflow: "contended_count", Fingerprint: fp, Request: canon})
		require.NoError(t, err)
		contended(t, key)
		require.NoError(t, holder.Rollback(w.ctx))
		require.Zero(t, w.count(`SELECT count(*) FROM onceflow_keys WHERE key = 'held-new'`))

		res, err := wf.Run(w.ctx, e, key, order)
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.Zero(t, attempts(key))
	})
	require.EqualValues(t, 2, ran.Load(), "each key ran its step once")
	require.Equal(t, 2, w.keys())
}
