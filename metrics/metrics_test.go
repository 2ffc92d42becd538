package metrics_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/sweeper"
	"github.com/onceflow/onceflow/workflow"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

type req struct{ N int }
type state struct{ Done bool }

// TestMetricsOverHTTP drives the engine, a relay and a pruner with one
// Metrics and scrapes them over HTTP.
func TestMetricsOverHTTP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.NewPool(t, 8)
	m := metrics.New()
	fail := true
	wf := workflow.Define("pay",
		phase.Atomic("write", func(context.Context, pgx.Tx, *phase.Run[req, state]) error { return nil }),
		foreign.Mutation("call", func(_ context.Context, c *foreign.Call[req, state]) error {
			if fail {
				fail = false
				return errors.New("provider timeout")
			}
			c.State.Done = true
			return nil
		}),
	)
	engine, err := workflow.NewEngine(db, workflow.Config{Observer: m})
	require.NoError(t, err)
	key := workflow.Key{Tenant: "acme", ID: "k1"}
	_, err = wf.Run(ctx, engine, key, req{1}) // new, then the call fails
	require.Error(t, err)
	_, err = wf.Run(ctx, engine, key, req{1}) // takeover
	require.NoError(t, err)
	_, err = wf.Run(ctx, engine, key, req{1}) // replay
	require.NoError(t, err)
	_, err = wf.Run(ctx, engine, key, req{2}) // mismatch
	require.ErrorIs(t, err, workflow.ErrMismatch)

	ob, err := outbox.New(outbox.Config{})
	require.NoError(t, err)
	require.NoError(t, ob.Enqueue(ctx, db, outbox.Message{Topic: "receipt", DedupeKey: "r1", Payload: 1}))
	relay, err := outbox.NewRelay(db, outbox.RelayConfig{Observer: m,
		Handlers: map[string]outbox.Handler{"receipt": func(context.Context, *outbox.Record) error { return nil }}})
	require.NoError(t, err)
	_, err = relay.RunOnce(ctx)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `UPDATE onceflow_keys SET completed_at = now() - interval '2 days'`)
	require.NoError(t, err)
	pruner, err := sweeper.NewPruner(db, sweeper.PrunerConfig{Observer: m, Pause: -1})
	require.NoError(t, err)
	reporter, err := sweeper.NewCompleter(db, nil, sweeper.CompleterConfig{Observer: m})
	require.NoError(t, err)
	_, err = db.Exec(ctx, `INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, owner, locked_until, created_at)
		VALUES ('acme', 'stuck', gen_random_uuid(), 'gone', decode(repeat('00', 32), 'hex'), gen_random_uuid(),
			now() - interval '1 hour', now() - interval '2 hours');
		INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, owner, status, recovery_point, last_error)
		VALUES ('acme', 'parked', gen_random_uuid(), 'pay', decode(repeat('00', 32), 'hex'), gen_random_uuid(),
			'parked', 'write', 'written by version 1, running version 2')`)
	require.NoError(t, err)
	s, err := sweeper.New(sweeper.Config{Observer: m, Tasks: []sweeper.Scheduled{
		{Schedule: "@hourly", Task: pruner}, {Schedule: "@hourly", Task: reporter}}})
	require.NoError(t, err)
	require.NoError(t, s.RunNow(ctx))
	busy := true
	retrying := workflow.Define("refund",
		foreign.Mutation("call", func(context.Context, *foreign.Call[req, state]) error {
			if busy {
				busy = false
				return errors.New("provider busy")
			}
			return nil
		}, foreign.Retry{Max: 2, Base: time.Microsecond}),
	)
	_, err = retrying.Run(ctx, engine, workflow.Key{Tenant: "acme", ID: "k2"}, req{1}) // one retry within the attempt
	require.NoError(t, err)

	pacing(t, db, m)

	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, line := range []string{
		`onceflow_claims_total{outcome="new",workflow="pay"} 1`,
		`onceflow_claims_total{outcome="takeover",workflow="pay"} 1`,
		`onceflow_claims_total{outcome="replay",workflow="pay"} 1`,
		`onceflow_claims_total{outcome="mismatch",workflow="pay"} 1`,
		`onceflow_step_duration_seconds_count{result="error",step="call",workflow="pay"} 1`,
		`onceflow_step_duration_seconds_count{result="ok",step="call",workflow="pay"} 1`,
		`onceflow_step_retries_total{step="call",workflow="refund"} 1`,
		`onceflow_pace_wait_seconds_count{downstream="payments"} 1`,
		`onceflow_pace_circuit_opened_total{downstream="payments"} 2`,
		`onceflow_pace_deferrals_total{downstream="payments"} 1`,
		`onceflow_outbox_messages_total{outcome="delivered",topic="receipt"} 1`,
		`onceflow_pruned_rows_total{table="onceflow_keys"} 1`,
		`onceflow_sweeper_task_runs_total{result="ok",task="pruner"} 1`,
		`onceflow_abandoned_records{workflow="gone"} 1`,
		`onceflow_parked_records{workflow="pay"} 1`,
		`onceflow_oldest_in_flight_seconds 72`, // two hours, as 7.2e+03
		`onceflow_oldest_stuck_seconds{workflow="gone"} 72`,
		`go_goroutines`,
	} {
		require.Contains(t, string(body), line)
	}
}

// pacing drives a paced engine reporting to m: a 429 asking for two
// seconds opens the circuit, which the next key waits out; a 429 asking for
// an hour opens it again, and the next key defers.
func pacing(t *testing.T, db workflow.DB, m *metrics.Metrics) {
	ctx := context.Background()
	engine, err := workflow.NewEngine(db, workflow.Config{Observer: m, Pacing: map[string]foreign.Pace{"payments": {}}})
	require.NoError(t, err)
	asks := map[string]time.Duration{"busy": 2 * time.Second, "busy-for-long": time.Hour}
	wf := workflow.Define("paced",
		foreign.Mutation("call", func(_ context.Context, c *foreign.Call[req, state]) error {
			if wait, ok := asks[c.Run.Key.ID]; ok {
				return &foreign.HTTPError{Status: 429, RetryAfter: wait}
			}
			return nil
		}, foreign.Limit("payments")),
	)
	for _, k := range []string{"busy", "waits", "busy-for-long", "deferred"} {
		_, err := wf.Run(ctx, engine, workflow.Key{Tenant: "acme", ID: k}, req{1})
		require.Equal(t, k == "waits", err == nil, "%s: %v", k, err)
	}
}

func TestHealth(t *testing.T) {
	t.Parallel()
	db := dbtest.NewPool(t, 2)
	srv := httptest.NewServer(sweeper.Health(db))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	db.Close()
	resp, err = http.Get(srv.URL)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Contains(t, string(body), "unavailable")
}
