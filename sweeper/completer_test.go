package sweeper_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/sweeper"
	"github.com/onceflow/onceflow/workflow"
)

// poison is a workflow whose first step always fails: each attempt hands
// its lease back (released), and the record waits out its backoff.
var poison = workflow.Define("poison",
	phase.Atomic("first", func(context.Context, pgx.Tx, *phase.Run[Order, State]) error {
		return errors.New("the first step always fails")
	}),
).Finish(func(s *State) workflow.Response { return workflow.JSON(201, s) })

// TestCompleterServesCrashedRecordsAmidPoison: tenant a has 200 poison
// records, released and due since long before tenant b's crashed record's
// lease ended; the first run, of the default batch size, still resumes b's
// record, because each tenant gets a turn before any gets a second.
func TestCompleterServesCrashedRecordsAmidPoison(t *testing.T) {
	b := setup(t)
	engine, err := workflow.NewEngine(b.db, workflow.Config{Workflows: []workflow.Definition{b.checkout, poison}})
	require.NoError(t, err)
	for i := range 200 {
		_, err := poison.Run(b.ctx, engine, workflow.Key{Tenant: "a", ID: fmt.Sprintf("poison-%03d", i)}, Order{})
		require.ErrorContains(t, err, "always fails")
	}
	crashed := b.abandonIn(t, "b", 1)[0]
	_, err = b.db.Exec(b.ctx, `UPDATE onceflow_keys SET updated_at = now() - interval '1 hour' WHERE tenant_id = 'a';
		UPDATE onceflow_keys SET updated_at = now() - interval '1 minute' WHERE tenant_id = 'b'`)
	require.NoError(t, err)
	require.Equal(t, 200, b.count(t, `SELECT count(*) FROM onceflow_keys
		WHERE tenant_id = 'a' AND status = 'in_flight' AND locked_until = '-infinity' AND attempts = 1`))

	completer, err := sweeper.NewCompleter(b.db, engine, sweeper.CompleterConfig{})
	require.NoError(t, err)
	require.NoError(t, completer.Run(b.ctx))
	rec, err := engine.Store().Load(b.ctx, crashed)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusCompleted, rec.Status, "the crashed record was resumed in the first run")
	require.Equal(t, sweeper.CompleteBatchDefault-1, b.count(t,
		`SELECT count(*) FROM onceflow_keys WHERE tenant_id = 'a' AND attempts = 2`), "the rest of the batch went to tenant a")
}

// TestCompleterServesATenantInDueOrder: within a tenant, the record that
// became due first is resumed first, whether its lease ended or its
// attempt handed the lease back; the backoff decides when a released
// record becomes due.
func TestCompleterServesATenantInDueOrder(t *testing.T) {
	b := setup(t)
	keys := b.abandon(t, 4)
	// keys[0]: released 10s ago after 1 attempt, due 8s ago (1s × 2¹).
	// keys[1]: its lease ended 90s ago, no attempt counted: due 90s ago.
	// keys[2]: released 60s ago after 2 attempts, due 56s ago (1s × 2²).
	// keys[3]: last updated 10 minutes ago, but its lease, renewed by a
	// long step, ended only 5s ago: due 5s ago.
	for i, c := range []struct {
		lockedUntil   string
		attempts, ago int
	}{{"-infinity", 1, 10}, {"90 seconds", 0, 120}, {"-infinity", 2, 60}, {"5 seconds", 0, 600}} {
		_, err := b.db.Exec(b.ctx, `UPDATE onceflow_keys SET attempts = $3, updated_at = now() - $4 * interval '1 second',
			locked_until = CASE WHEN $5 = '-infinity' THEN '-infinity' ELSE now() - $5::interval END
			WHERE tenant_id = $1 AND key = $2`, keys[i].Tenant, keys[i].ID, c.attempts, c.ago, c.lockedUntil)
		require.NoError(t, err)
	}
	engine, err := workflow.NewEngine(b.db, workflow.Config{Workflows: []workflow.Definition{b.checkout}})
	require.NoError(t, err)
	completer, err := sweeper.NewCompleter(b.db, engine, sweeper.CompleterConfig{BatchSize: 1, BackoffBase: sweeper.BackoffBaseDefault})
	require.NoError(t, err)
	want := []string{keys[1].ID, keys[2].ID, keys[0].ID, keys[3].ID}
	for run := range want {
		require.NoError(t, completer.Run(b.ctx))
		rows, err := b.db.Query(b.ctx, `SELECT key FROM onceflow_keys WHERE status = 'completed' ORDER BY completed_at`)
		require.NoError(t, err)
		done, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Equal(t, want[:run+1], done, "after run %d", run+1)
	}
}

// TestCompleterReadsOnlyRecordsInFlight: among many finished records, the
// completer's query reaches the few in flight through their partial index,
// not by reading the table.
func TestCompleterReadsOnlyRecordsInFlight(t *testing.T) {
	b := setup(t)
	seed(t, b.db, 50_000, "completed", "1 hour")
	seed(t, b.db, 200, "in_flight", "1 hour")
	_, err := b.db.Exec(b.ctx, `ANALYZE onceflow_keys`)
	require.NoError(t, err)
	var plan string
	require.NoError(t, b.db.QueryRow(b.ctx, `EXPLAIN (FORMAT JSON) `+sweeper.DueSQL,
		[]string{"op"}, int64(1e6), int64(36e8), 100).Scan(&plan))
	require.Contains(t, plan, `"Index Name": "onceflow_keys_in_flight_idx"`)
	require.NotContains(t, plan, `"Seq Scan"`)
}
