package sweeper_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/sweeper"
	"github.com/onceflow/onceflow/workflow"
)

// helper starts this test binary in a helper mode against b's database and
// provider.
func (b *bundle) helper(t *testing.T, mode string) (*exec.Cmd, *bufio.Reader, func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), "SWEEPER_HELPER="+mode, "SWEEPER_DB="+b.url, "SWEEPER_PROVIDER="+b.provider.URL)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, bufio.NewReader(stdout), func() { _, _ = stdin.Write([]byte("go\n")) }
}

// TestCompleterFinishesWorkOfADeadProcess: a process dies right after the
// charge; with no client retry, the completer takes the record over and
// finishes it; a later client retry gets the replay.
func TestCompleterFinishesWorkOfADeadProcess(t *testing.T) {
	b := setup(t)
	cmd, _, start := b.helper(t, "crash")
	start()
	err := cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, 3, exit.ExitCode(), "the helper died at the crash point")
	key := workflow.Key{Tenant: "acme", ID: "died-1"}

	engine, err := workflow.NewEngine(b.db, workflow.Config{Workflows: []workflow.Definition{b.checkout}})
	require.NoError(t, err)
	rec, err := engine.Store().Load(b.ctx, key)
	require.NoError(t, err)
	require.Equal(t, "create_order", rec.RecoveryPoint)
	require.NoError(t, engine.Store().ExpireLease(b.ctx, key)) // rather than wait out the lease

	obs := newRecorder()
	completer, err := sweeper.NewCompleter(b.db, engine, sweeper.CompleterConfig{BackoffBase: -1, Observer: obs})
	require.NoError(t, err)
	require.NoError(t, completer.Run(b.ctx))
	require.Equal(t, 1, obs.resumed["checkout"])

	rec, err = engine.Store().Load(b.ctx, key)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusCompleted, rec.Status)
	require.Equal(t, 1, rec.Attempts, "the dead attempt is counted")

	res, err := engine.Run(b.ctx, key, b.checkout, Order{Amount: 100})
	require.NoError(t, err)
	require.True(t, res.Replayed, "the client's late retry gets the completer's response")
	require.Equal(t, rec.Response.Body, res.Response.Body)
	keys, maxCalls := b.provider.effects()
	require.Equal(t, 1, keys)
	require.Equal(t, 2, maxCalls, "the charge was sent again after the crash, with the same key")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM orders WHERE charge_id IS NOT NULL`))
}

// TestTwoSweepersCompleteEachRecordOnce: two sweeper processes race over
// 200 abandoned records; each record is resumed and completed once, and the
// provider sees one effect per record.
func TestTwoSweepersCompleteEachRecordOnce(t *testing.T) {
	b := setup(t)
	const records = 200
	b.abandon(t, records)

	_, outA, startA := b.helper(t, "complete")
	_, outB, startB := b.helper(t, "complete")
	startA()
	startB()
	total := 0
	for _, out := range []*bufio.Reader{outA, outB} {
		line, err := out.ReadString('\n')
		require.NoError(t, err)
		n, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "completed "))
		require.NoError(t, err, "helper said %q", line)
		t.Logf("a sweeper completed %d records", n)
		total += n
	}
	require.Equal(t, records, total, "each record was completed by exactly one sweeper")
	require.Equal(t, records, b.count(t, `SELECT count(*) FROM onceflow_keys WHERE status = 'completed'`))
	require.Equal(t, records, b.count(t, `SELECT count(*) FROM orders WHERE charge_id IS NOT NULL`))
	keys, maxCalls := b.provider.effects()
	require.Equal(t, records, keys, "one downstream key per record")
	require.LessOrEqual(t, maxCalls, 2, "a charge is sent once before the crash and once on resume, at most")
}

func TestCompleterReportsWhatItCannotResume(t *testing.T) {
	b := setup(t)
	b.abandon(t, 3)
	obs := newRecorder()
	reporter, err := sweeper.NewCompleter(b.db, nil, sweeper.CompleterConfig{Observer: obs})
	require.NoError(t, err)
	require.NoError(t, reporter.Run(b.ctx))
	require.Equal(t, 3, obs.abandoned["checkout"])
	require.Positive(t, obs.oldest)
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM onceflow_keys WHERE status = 'in_flight' AND attempts = 0`),
		"records it cannot resume are not touched")

	// Once another engine finishes them, the report drops to zero.
	engine, err := workflow.NewEngine(b.db, workflow.Config{Workflows: []workflow.Definition{b.checkout}})
	require.NoError(t, err)
	completer, err := sweeper.NewCompleter(b.db, engine, sweeper.CompleterConfig{BackoffBase: -1})
	require.NoError(t, err)
	require.NoError(t, completer.Run(b.ctx))
	require.NoError(t, reporter.Run(b.ctx))
	require.Zero(t, obs.abandoned["checkout"])
	require.Zero(t, obs.oldest)
}

// TestCompleterBacksOffFailingRecords: a record is resumed no sooner than
// base × 2^attempts after its last update, at most the cap.
func TestCompleterBacksOffFailingRecords(t *testing.T) {
	b := setup(t)
	keys := b.abandon(t, 4)
	engine, err := workflow.NewEngine(b.db, workflow.Config{Workflows: []workflow.Definition{b.checkout}})
	require.NoError(t, err)
	completer, err := sweeper.NewCompleter(b.db, engine, sweeper.CompleterConfig{BackoffBase: time.Second, BackoffMax: time.Minute})
	require.NoError(t, err)
	// attempts, seconds since the last update, and whether it is due:
	// 3 attempts wait 8s; 30 attempts wait the cap, a minute.
	cases := []struct {
		attempts, ago int
		due           bool
	}{{3, 5, false}, {3, 9, true}, {30, 50, false}, {30, 61, true}}
	for i, c := range cases {
		_, err := b.db.Exec(b.ctx, `UPDATE onceflow_keys SET attempts = $3, updated_at = now() - $4 * interval '1 second'
			WHERE tenant_id = $1 AND key = $2`, keys[i].Tenant, keys[i].ID, c.attempts, c.ago)
		require.NoError(t, err)
	}
	require.NoError(t, completer.Run(b.ctx))
	for i, c := range cases {
		rec, err := engine.Store().Load(b.ctx, keys[i])
		require.NoError(t, err)
		require.Equal(t, c.due, rec.Status != recovery.StatusInFlight, "case %d: %+v", i, c)
	}
}

// TestPrunerDeletesOnlyWhatIsDue: finished records older than the
// retention go, in batches; records in flight, however old, and recent
// ones stay; delivered outbox messages go, dead ones stay.
func TestPrunerDeletesOnlyWhatIsDue(t *testing.T) {
	b := setup(t)
	seed(t, b.db, 2500, "completed", "2 days")
	seed(t, b.db, 40, "in_flight", "2 days")
	seed(t, b.db, 30, "completed", "1 hour")
	_, err := b.db.Exec(b.ctx, `
		INSERT INTO onceflow_outbox (topic, dedupe_key, payload, status, delivered_at)
		SELECT 'receipt', 'old-' || i, '{}', 'delivered', now() - interval '2 days' FROM generate_series(1, 25) i;
		INSERT INTO onceflow_outbox (topic, dedupe_key, payload, status) VALUES ('receipt', 'dead-1', '{}', 'dead');
		INSERT INTO onceflow_outbox (topic, dedupe_key, payload) VALUES ('receipt', 'pending-1', '{}')`)
	require.NoError(t, err)
	inFlightBefore := versions(t, b.db, `WHERE status = 'in_flight'`)

	obs := newRecorder()
	pruner, err := sweeper.NewPruner(b.db, sweeper.PrunerConfig{BatchSize: 1000, Pause: -1, Observer: obs})
	require.NoError(t, err)
	require.NoError(t, pruner.Run(b.ctx))
	require.Equal(t, 2500, obs.pruned["onceflow_keys"])
	require.Equal(t, 25, obs.pruned["onceflow_outbox"])
	require.Equal(t, 70, b.count(t, `SELECT count(*) FROM onceflow_keys`))
	require.Equal(t, inFlightBefore, versions(t, b.db, `WHERE status = 'in_flight'`), "in-flight records untouched")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM onceflow_outbox`), "the dead and the pending message stay")
}

// TestPrunerGivesUpOnPersistentTimeouts: with the table locked by someone
// else, every batch times out; the pruner shrinks its batches, then gives
// up until its next turn.
func TestPrunerGivesUpOnPersistentTimeouts(t *testing.T) {
	b := setup(t)
	seed(t, b.db, 50, "completed", "2 days")
	locker, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer locker.Rollback(b.ctx)
	_, err = locker.Exec(b.ctx, `LOCK TABLE onceflow_keys IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	pruner, err := sweeper.NewPruner(b.db, sweeper.PrunerConfig{QueryTimeout: 20 * time.Millisecond, Pause: -1})
	require.NoError(t, err)
	err = pruner.Run(b.ctx)
	require.ErrorContains(t, err, "timed out in a row")
	require.NoError(t, locker.Rollback(b.ctx))
	require.Equal(t, 50, b.count(t, `SELECT count(*) FROM onceflow_keys`))
}

// TestPruningWhileClaiming: 100k expired records are pruned while claims
// continue; no claim fails and no record in flight is touched.
func TestPruningWhileClaiming(t *testing.T) {
	b := setup(t)
	seed(t, b.db, 100_000, "completed", "2 days")
	seed(t, b.db, 500, "in_flight", "2 days")
	inFlightBefore := versions(t, b.db, `WHERE status = 'in_flight'`)
	store, err := recovery.New(b.db, recovery.Config{})
	require.NoError(t, err)

	pruned := make(chan error, 1)
	pruner, err := sweeper.NewPruner(b.db, sweeper.PrunerConfig{BatchSize: 2000, Pause: time.Millisecond})
	require.NoError(t, err)
	started := time.Now()
	go func() { pruned <- pruner.Run(b.ctx) }()

	var (
		wg     sync.WaitGroup
		claims atomic.Int64
		failed atomic.Int64
		done   atomic.Bool
	)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; !done.Load(); i++ {
				key := recovery.Key{Tenant: "live", ID: fmt.Sprintf("w%d-%d", w, i)}
				rec, outcome, err := store.Claim(b.ctx, recovery.ClaimParams{Key: key, Workflow: "op",
					Fingerprint: recovery.FingerprintBytes("op", nil)})
				if err != nil || outcome != recovery.OutcomeNew {
					failed.Add(1)
					continue
				}
				if err := store.Complete(b.ctx, rec.Fence(), recovery.Response{Status: 200}); err != nil {
					failed.Add(1)
					continue
				}
				claims.Add(1)
			}
		})
	}
	require.NoError(t, <-pruned)
	took := time.Since(started)
	done.Store(true)
	wg.Wait()

	t.Logf("pruned 100000 records in %s (%.0f rows/s) while %d claims completed", took.Round(time.Millisecond),
		100_000/took.Seconds(), claims.Load())
	require.Zero(t, failed.Load(), "every claim succeeded during pruning")
	require.Positive(t, claims.Load())
	require.Zero(t, b.count(t, `SELECT count(*) FROM onceflow_keys WHERE tenant_id = 'seed' AND status = 'completed'`))
	require.Equal(t, inFlightBefore, versions(t, b.db, `WHERE status = 'in_flight'`))
	require.EqualValues(t, claims.Load(), b.count(t, `SELECT count(*) FROM onceflow_keys WHERE tenant_id = 'live'`))
}

// seed inserts n records of status whose timestamps lie age in the past.
func seed(t *testing.T, db *pgxpool.Pool, n int, status, age string) {
	t.Helper()
	finished := status != "in_flight"
	_, err := db.Exec(context.Background(), `
		INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, owner, status, locked_until,
			response_status, response_body, created_at, updated_at, completed_at)
		SELECT 'seed', $1 || '-' || $2 || '-' || i, gen_random_uuid(), 'op', decode(repeat('00', 32), 'hex'),
			gen_random_uuid(), $1,
			CASE WHEN $3 THEN NULL ELSE now() - $2::interval END,
			CASE WHEN $3 THEN 200 END, CASE WHEN $3 THEN ''::bytea END,
			now() - $2::interval, now() - $2::interval, CASE WHEN $3 THEN now() - $2::interval END
		FROM generate_series(1, $4) i`, status, age, finished, n)
	require.NoError(t, err)
}

// versions fingerprints the physical row versions matching where.
func versions(t *testing.T, db *pgxpool.Pool, where string) string {
	t.Helper()
	var v string
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT count(*)::text || ':' || coalesce(md5(string_agg(xmin::text || ctid::text, ',' ORDER BY key)), '')
		FROM onceflow_keys `+where).Scan(&v))
	return v
}

type blockingTask struct {
	runs    atomic.Int32
	running chan struct{}
}

func (t *blockingTask) Name() string { return "blocking" }

func (t *blockingTask) Run(ctx context.Context) error {
	if t.runs.Add(1) == 2 {
		close(t.running)
		<-ctx.Done() // a long run, stopped by Stop
		return ctx.Err()
	}
	return nil
}

// TestSweeperRunsOnScheduleAndStops: tasks run on their cron schedule; Stop
// cancels a running task and waits for it; Stop is safe twice.
func TestSweeperRunsOnScheduleAndStops(t *testing.T) {
	t.Parallel()
	task := &blockingTask{running: make(chan struct{})}
	obs := newRecorder()
	s, err := sweeper.New(sweeper.Config{Tasks: []sweeper.Scheduled{{Schedule: "@every 1s", Task: task}}, Observer: obs})
	require.NoError(t, err)
	s.Stop() // before Start: nothing to do
	require.NoError(t, s.Start(context.Background()))
	require.Error(t, s.Start(context.Background()), "started twice")
	<-task.running // the second run is under way and blocks
	var stops sync.WaitGroup
	for range 3 {
		stops.Go(s.Stop) // every call returns once the sweeper has stopped
	}
	stops.Wait()
	s.Stop()
	require.EqualValues(t, 2, task.runs.Load(), "no run overlaps and none starts after Stop")
	require.Equal(t, 2, obs.runs["blocking"], "Stop waited for the running task to return")

	_, err = sweeper.New(sweeper.Config{Tasks: []sweeper.Scheduled{{Schedule: "every now and then", Task: task}}})
	require.Error(t, err)
	_, err = sweeper.New(sweeper.Config{})
	require.Error(t, err)
}

type panickyTask struct{}

func (panickyTask) Name() string                  { return "panicky" }
func (panickyTask) Run(ctx context.Context) error { panic("bad task") }

type failingTask struct{}

func (failingTask) Name() string                  { return "failing" }
func (failingTask) Run(ctx context.Context) error { return errors.New("table missing") }

func TestRunNowReportsFailuresAndSurvivesPanics(t *testing.T) {
	t.Parallel()
	obs := newRecorder()
	s, err := sweeper.New(sweeper.Config{Observer: obs, Tasks: []sweeper.Scheduled{
		{Schedule: "@hourly", Task: panickyTask{}}, {Schedule: "@hourly", Task: failingTask{}},
	}})
	require.NoError(t, err)
	err = s.RunNow(context.Background())
	require.ErrorContains(t, err, "panicky: task panicked: bad task")
	require.ErrorContains(t, err, "failing: table missing")
	require.Equal(t, 1, obs.runs["panicky"])
	require.Equal(t, 1, obs.runs["failing"])
}

func TestRelayTaskDelivers(t *testing.T) {
	b := setup(t)
	ob, err := outbox.New(outbox.Config{})
	require.NoError(t, err)
	require.NoError(t, ob.Enqueue(b.ctx, b.db, outbox.Message{Topic: "t", DedupeKey: "k", Payload: 1}))
	delivered := make(chan string, 1)
	relay, err := outbox.NewRelay(b.db, outbox.RelayConfig{Handlers: map[string]outbox.Handler{
		"t": func(_ context.Context, m *outbox.Record) error { delivered <- m.DedupeKey; return nil },
	}})
	require.NoError(t, err)
	task := sweeper.RelayTask(relay)
	require.Equal(t, "relay", task.Name())
	require.NoError(t, task.Run(b.ctx))
	require.Equal(t, "k", <-delivered)
}

// helperMain runs one of the helper processes the tests start.
func helperMain() int {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("SWEEPER_DB"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer db.Close()
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // wait for "go"
	wf := checkout(os.Getenv("SWEEPER_PROVIDER"))
	switch os.Getenv("SWEEPER_HELPER") {
	case "crash":
		// Die right after the charge, before its result is committed.
		e, err := workflow.NewEngine(db, workflow.Config{Hooks: &workflow.Hooks{
			CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
				if p == (workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"}) {
					os.Exit(3)
				}
				return nil
			},
		}})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		_, err = e.Run(ctx, workflow.Key{Tenant: "acme", ID: "died-1"}, wf, Order{Amount: 100})
		fmt.Fprintln(os.Stderr, "the crash point was not reached:", err)
		return 1
	case "complete":
		return completeAll(ctx, db, wf)
	}
	return 1
}

// completeAll runs a completer until no record is left in flight and
// prints how many records it completed itself.
func completeAll(ctx context.Context, db *pgxpool.Pool, wf workflow.Definition) int {
	engine, err := workflow.NewEngine(db, workflow.Config{Workflows: []workflow.Definition{wf}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	obs := newRecorder()
	completer, err := sweeper.NewCompleter(db, engine, sweeper.CompleterConfig{
		BackoffBase: -1, BatchSize: 20, Concurrency: 8, Observer: obs})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for range 1000 {
		if err := completer.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		var left int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM onceflow_keys WHERE status = 'in_flight'`).Scan(&left); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if left == 0 {
			break
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	fmt.Printf("completed %d\n", obs.resumed["checkout"])
	return 0
}

// TestPrunerDeletesAbandonedMiddlewareClaimsWhenAsked: request-less keys in
// flight whose lease ended long ago go only with AbandonedRetention; a
// workflow's key, which stores its request, always stays.
func TestPrunerDeletesAbandonedMiddlewareClaimsWhenAsked(t *testing.T) {
	b := setup(t)
	seed(t, b.db, 5, "in_flight", "2 days") // request-less
	b.abandon(t, 2)                         // workflow keys: they store their request
	_, err := b.db.Exec(b.ctx, `UPDATE onceflow_keys SET locked_until = now() - interval '2 days'`)
	require.NoError(t, err)

	keep, err := sweeper.NewPruner(b.db, sweeper.PrunerConfig{Pause: -1})
	require.NoError(t, err)
	require.NoError(t, keep.Run(b.ctx))
	require.Equal(t, 7, b.count(t, `SELECT count(*) FROM onceflow_keys`), "kept by default")

	drop, err := sweeper.NewPruner(b.db, sweeper.PrunerConfig{Pause: -1, AbandonedRetention: 24 * time.Hour})
	require.NoError(t, err)
	require.NoError(t, drop.Run(b.ctx))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM onceflow_keys`))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM onceflow_keys WHERE request IS NOT NULL`))
}
