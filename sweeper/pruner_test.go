package sweeper_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/sweeper"
)

// TestPrunerPrunesProcessedMessagesNoRedeliveryCanReach: a consumer's
// record of a processed message goes once it is older than the retention
// and no redelivery of its message can come: the message was delivered, or
// pruned. It stays while a message with its dedupe key is pending, or dead
// (an operator may revive it): when the operator does, the consumer still
// drops the redelivery.
func TestPrunerPrunesProcessedMessagesNoRedeliveryCanReach(t *testing.T) {
	b := setup(t)
	_, err := b.db.Exec(b.ctx, `
		INSERT INTO onceflow_outbox (topic, dedupe_key, payload, status, delivered_at)
		SELECT 'receipt', 'delivered-' || i, '{}', 'delivered', now() - interval '1 hour' FROM generate_series(1, 20) i;
		INSERT INTO onceflow_outbox (topic, dedupe_key, payload, status) VALUES
			('receipt', 'pending', '{}', 'pending'), ('receipt', 'dead', '{}', 'dead'), ('sms', 'pending-sms', '{}', 'pending');
		INSERT INTO onceflow_outbox (topic, dedupe_key, payload, status, delivered_at) VALUES
			('receipt', 'pending-sms', '{}', 'delivered', now() - interval '1 hour');
		INSERT INTO onceflow_processed (consumer, dedupe_key, processed_at)
		SELECT 'receipts', 'delivered-' || i, now() - interval '2 days' FROM generate_series(1, 20) i
		UNION ALL SELECT 'receipts', 'pruned-' || i, now() - interval '2 days' FROM generate_series(1, 5) i
		UNION ALL SELECT 'receipts', k, now() - interval '2 days' FROM unnest(array['pending', 'dead', 'pending-sms']) k
		UNION ALL SELECT 'receipts', 'recent', now() - interval '1 hour'`)
	require.NoError(t, err)

	keep, err := sweeper.NewPruner(b.db, sweeper.PrunerConfig{Pause: -1, ProcessedRetention: -1})
	require.NoError(t, err)
	require.NoError(t, keep.Run(b.ctx))
	require.Equal(t, 29, b.count(t, `SELECT count(*) FROM onceflow_processed`), "-1 keeps them")

	obs := newRecorder()
	pruner, err := sweeper.NewPruner(b.db, sweeper.PrunerConfig{Pause: -1, BatchSize: 10, Observer: obs})
	require.NoError(t, err)
	require.NoError(t, pruner.Run(b.ctx))
	require.Equal(t, 25, obs.pruned["onceflow_processed"], "delivered or pruned, older than the retention")
	rows, err := b.db.Query(b.ctx, `SELECT dedupe_key FROM onceflow_processed ORDER BY dedupe_key`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"dead", "pending", "pending-sms", "recent"}, left,
		"kept while a message with the key is pending or dead, in any topic, and while recent")

	// An operator revives the dead message; the consumer drops it.
	ob, err := outbox.New(outbox.Config{})
	require.NoError(t, err)
	dead, err := ob.List(b.ctx, b.db, outbox.Filter{Status: outbox.StatusDead})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.NoError(t, ob.Retry(b.ctx, b.db, dead[0].ID))
	var effects atomic.Int32
	relay, err := outbox.NewRelay(b.db, outbox.RelayConfig{Handlers: map[string]outbox.Handler{
		"receipt": func(ctx context.Context, m *outbox.Record) error {
			return pgx.BeginFunc(ctx, b.db, func(tx pgx.Tx) error {
				_, err := ob.Process(ctx, tx, "receipts", m.DedupeKey, func() error { effects.Add(1); return nil })
				return err
			})
		},
	}})
	require.NoError(t, err)
	stats, err := relay.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, stats.Delivered, "the revived message and the pending one")
	require.Zero(t, effects.Load(), "both were processed before: no effect again")
}

// TestPrunerBatchesReadOnlyWhatTheyDelete: with many rows due, a prune
// batch finds them through an index, oldest first up to the batch size,
// and deletes them without reading the table whole: processed records are
// checked against the outbox through the index of undelivered messages.
func TestPrunerBatchesReadOnlyWhatTheyDelete(t *testing.T) {
	b := setup(t)
	seed(t, b.db, 20_000, "completed", "2 days")
	_, err := b.db.Exec(b.ctx, `
		INSERT INTO onceflow_outbox (topic, dedupe_key, payload, status, delivered_at)
		SELECT 'receipt', 'k-' || i, '{}', 'delivered', now() - interval '2 days' FROM generate_series(1, 20000) i;
		INSERT INTO onceflow_outbox (topic, dedupe_key, payload) SELECT 'receipt', 'p-' || i, '{}' FROM generate_series(1, 20) i;
		INSERT INTO onceflow_processed (consumer, dedupe_key, processed_at)
		SELECT 'receipts', 'k-' || i, now() - interval '2 days' - i * interval '1 second' FROM generate_series(1, 20000) i;
		ANALYZE onceflow_keys; ANALYZE onceflow_outbox; ANALYZE onceflow_processed`)
	require.NoError(t, err)
	for sql, indexes := range map[string][]string{
		sweeper.PruneKeysSQL:      {"onceflow_keys_finished_idx"},
		sweeper.PruneOutboxSQL:    {"onceflow_outbox_delivered_idx"},
		sweeper.PruneProcessedSQL: {"onceflow_processed_at_idx", "onceflow_outbox_undelivered_idx"},
	} {
		var plan string
		require.NoError(t, b.db.QueryRow(b.ctx, `EXPLAIN (FORMAT JSON) `+sql,
			sweeper.RetentionDefault.Microseconds(), sweeper.PruneBatchDefault).Scan(&plan))
		for _, index := range indexes {
			require.Contains(t, plan, `"Index Name": "`+index+`"`)
		}
		require.NotContains(t, plan, `"Seq Scan"`)
	}
}

// TestPrunerStopsAtTheCutOff: each prune statement reads its index only up
// to the retention's cut-off, so a run with nothing left to prune reads
// nothing, not every recent row.
func TestPrunerStopsAtTheCutOff(t *testing.T) {
	b := setup(t)
	seed(t, b.db, 20_000, "completed", "1 hour")
	_, err := b.db.Exec(b.ctx, `
		INSERT INTO onceflow_outbox (topic, dedupe_key, payload, status, delivered_at)
		SELECT 'receipt', 'k-' || i, '{}', 'delivered', now() - interval '1 hour' FROM generate_series(1, 20000) i;
		INSERT INTO onceflow_processed (consumer, dedupe_key, processed_at)
		SELECT 'receipts', 'k-' || i, now() - interval '1 hour' FROM generate_series(1, 20000) i;
		ANALYZE onceflow_keys; ANALYZE onceflow_outbox; ANALYZE onceflow_processed`)
	require.NoError(t, err)
	for sql, column := range map[string]string{
		sweeper.PruneKeysSQL: "completed_at", sweeper.PruneOutboxSQL: "delivered_at", sweeper.PruneProcessedSQL: "processed_at",
	} {
		var plan string
		require.NoError(t, b.db.QueryRow(b.ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+sql,
			sweeper.RetentionDefault.Microseconds(), sweeper.PruneBatchDefault).Scan(&plan))
		require.Contains(t, plan, `"Index Cond": "(`+column+` <`, "the cut-off bounds the index scan")
		require.NotContains(t, plan, `"Rows Removed by Filter": 20000`, "no recent row was read")
	}
	require.Equal(t, 20_000, b.count(t, `SELECT count(*) FROM onceflow_processed`))
}
