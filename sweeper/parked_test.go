package sweeper_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/sweeper"
	"github.com/onceflow/onceflow/workflow"
)

// stepRuns counts the steps a definition ran, by name.
type stepRuns struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *stepRuns) add(step string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n[step]++
}

func (r *stepRuns) counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.n {
		out[k] = v
	}
	return out
}

// checkoutV2 is the shared checkout with a step inserted before charge: a
// record the checkout left after create_order (its charge may have been
// made) is parked by it. It charges through the provider at providerURL,
// and counts its steps in runs.
func checkoutV2(providerURL string, runs *stepRuns) *workflow.Workflow[Order, State] {
	atomic := func(name string) phase.Step[Order, State] {
		return phase.Atomic(name, func(_ context.Context, _ pgx.Tx, r *phase.Run[Order, State]) error {
			runs.add(r.Step)
			return nil
		})
	}
	return workflow.Define("checkout",
		atomic("create_order"),
		atomic("fraud_check"),
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[Order, State]) error {
			runs.add(c.Step)
			id, err := testapp.Call(ctx, providerURL, "charges", c.Key)
			c.State.ChargeID = id
			return err
		}),
		atomic("record_charge"),
	).Version("2").Finish(func(s *State) workflow.Response { return workflow.JSON(201, s) })
}

// logBuffer collects a logger's output; safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestCompleterLeavesParkedRecordsAndReportsThem: records the checkout
// left after create_order are parked by a completer whose engine runs a
// version with a step inserted before charge. From then on the completer
// never picks them, pass after pass: no step runs, no resume is tried,
// and each pass reports them (Observer.ParkedRecords, with a Warn log when
// the count changes). Once an operator resumes one under version 2, the
// next pass finishes it without a second charge; once the other is failed,
// the count falls to 0.
func TestCompleterLeavesParkedRecordsAndReportsThem(t *testing.T) {
	b := setup(t)
	keys := b.abandon(t, 2)
	runs := &stepRuns{n: map[string]int{}}
	var logs logBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	engine, err := workflow.NewEngine(b.db, workflow.Config{Logger: logger,
		Workflows: []workflow.Definition{checkoutV2(b.provider.URL, runs)}})
	require.NoError(t, err)
	obs := newRecorder()
	completer, err := sweeper.NewCompleter(b.db, engine, sweeper.CompleterConfig{BackoffBase: -1, Observer: obs, Logger: logger})
	require.NoError(t, err)
	status := func(k workflow.Key) recovery.Status {
		t.Helper()
		rec, err := engine.Store().Load(b.ctx, k)
		require.NoError(t, err)
		return rec.Status
	}

	require.NoError(t, completer.Run(b.ctx))
	for _, k := range keys {
		require.Equal(t, recovery.StatusParked, status(k), "version 2 may not resume %s", k.ID)
	}
	require.Equal(t, 2, obs.attempted["checkout"], "the first pass tried both, and they parked")
	require.Equal(t, 2, strings.Count(logs.String(), "record parked"), "one log line per parked record, from the engine: %s", logs.String())
	require.NotContains(t, logs.String(), "could not complete", "parking is not a failure to log twice")

	for pass := range 3 {
		require.NoError(t, completer.Run(b.ctx))
		for _, k := range keys {
			require.Equal(t, recovery.StatusParked, status(k), "pass %d", pass)
		}
		require.Equal(t, 2, obs.attempted["checkout"], "pass %d tried no parked record", pass)
		require.Equal(t, 2, obs.parkedNow("checkout"), "pass %d", pass)
	}
	require.Empty(t, runs.counts(), "no step of version 2 ran")
	require.Equal(t, 2, b.provider.Effects("charges"), "one charge each, by the checkout that crashed")
	require.Equal(t, 1, strings.Count(logs.String(), "parked records wait for an operator"), "a Warn when the count changed: %s", logs.String())
	require.Contains(t, logs.String(), `level=WARN msg="parked records wait for an operator: onceflow keys list --status parked" workflow=checkout records=2`)

	// An operator resumes the first as version 2 (onceflow keys resume --as 2).
	first, err := engine.Store().Load(b.ctx, keys[0])
	require.NoError(t, err)
	require.NoError(t, engine.Store().Unpark(b.ctx, first.Fence(), engine.Specs()[0].Fingerprint, "resumed by an operator"))
	require.NoError(t, completer.Run(b.ctx))
	require.Equal(t, recovery.StatusCompleted, status(keys[0]))
	require.Equal(t, map[string]int{"fraud_check": 1, "charge": 1, "record_charge": 1}, runs.counts(),
		"version 2 ran after the recovery point, create_order")
	require.Equal(t, 2, b.provider.Effects("charges"), "the charge was made again with its derived key: no second effect")
	require.Equal(t, 1, obs.parkedNow("checkout"), "the resumed record is in flight, no longer parked")

	// An operator fails the other (onceflow keys fail).
	second, err := engine.Store().Load(b.ctx, keys[1])
	require.NoError(t, err)
	require.NoError(t, seam.StoreOf(engine.Store()).FailLeaseOver(b.ctx, second.Fence(),
		workflow.Problem(500, "stopped"), "failed by an operator"))
	require.NoError(t, completer.Run(b.ctx))
	require.Equal(t, 0, obs.parkedNow("checkout"), "none left: the gauge says 0")
	require.Equal(t, 3, obs.attempted["checkout"], "only the resumed record was tried")
}

// TestCompleterCountsParkedRecordsThroughTheirIndex: among many finished
// records, the count of parked ones reads the partial index that holds
// exactly them.
func TestCompleterCountsParkedRecordsThroughTheirIndex(t *testing.T) {
	b := setup(t)
	seed(t, b.db, 50_000, "completed", "1 hour")
	seedParked(t, b, 20, "1 hour")
	_, err := b.db.Exec(b.ctx, `ANALYZE onceflow_keys`)
	require.NoError(t, err)
	var plan string
	require.NoError(t, b.db.QueryRow(b.ctx, `EXPLAIN (FORMAT JSON) `+sweeper.ParkedSQL).Scan(&plan))
	require.Contains(t, plan, `"Index Name": "onceflow_keys_parked_idx"`)
	require.NotContains(t, plan, `"Seq Scan"`)

	obs := newRecorder()
	reporter, err := sweeper.NewCompleter(b.db, nil, sweeper.CompleterConfig{Observer: obs})
	require.NoError(t, err)
	require.NoError(t, reporter.Run(b.ctx))
	require.Equal(t, 20, obs.parkedNow("op"))
}

// seedParked inserts n parked records of workflow op, last updated age
// ago.
func seedParked(t *testing.T, b *bundle, n int, age string) {
	t.Helper()
	_, err := b.db.Exec(b.ctx, `
		INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, owner, status, recovery_point,
			last_error, created_at, updated_at)
		SELECT 'seed', 'parked-' || i, gen_random_uuid(), 'op', decode(repeat('00', 32), 'hex'), gen_random_uuid(),
			'parked', 'first', 'written by version 1, running version 2', now() - $1::interval, now() - $1::interval
		FROM generate_series(1, $2) i`, age, n)
	require.NoError(t, err)
}

// TestPrunerKeepsParkedRecords: the pruner deletes finished records, by
// their status; a parked record is not finished and stays, however old,
// whatever its other columns say. (A parked record has no completed_at
// today; the test gives it one, two days old, so that the pruner's status
// rule is what keeps it.)
func TestPrunerKeepsParkedRecords(t *testing.T) {
	b := setup(t)
	keys := b.abandon(t, 1)
	engine, err := workflow.NewEngine(b.db, workflow.Config{
		Workflows: []workflow.Definition{checkoutV2(b.provider.URL, &stepRuns{n: map[string]int{}})}})
	require.NoError(t, err)
	_, err = engine.Resume(b.ctx, keys[0])
	require.ErrorIs(t, err, workflow.ErrParked)
	seed(t, b.db, 3, "completed", "2 days")
	seed(t, b.db, 2, "failed", "2 days")
	_, err = b.db.Exec(b.ctx, `UPDATE onceflow_keys SET completed_at = now() - interval '2 days', updated_at = now() - interval '2 days'
		WHERE status = 'parked'`)
	require.NoError(t, err)

	obs := newRecorder()
	pruner, err := sweeper.NewPruner(b.db, sweeper.PrunerConfig{Pause: -1, Observer: obs})
	require.NoError(t, err)
	require.NoError(t, pruner.Run(b.ctx))
	require.Equal(t, 5, obs.pruned["onceflow_keys"], "the completed and failed records went")
	rec, err := engine.Store().Load(b.ctx, keys[0])
	require.NoError(t, err)
	require.Equal(t, recovery.StatusParked, rec.Status, "the parked record stays")
}
