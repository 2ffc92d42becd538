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

	"github.com/google/uuid"
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

	res, err := b.checkout.Run(b.ctx, engine, key, Order{Amount: 100})
	require.NoError(t, err)
	require.True(t, res.Replayed, "the client's late retry gets the completer's response")
	require.Equal(t, rec.Response.Body, res.Response.Body)
	keys, maxCalls := b.provider.Effects("charges"), b.provider.MaxCalls("charges")
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
	keys, maxCalls := b.provider.Effects("charges"), b.provider.MaxCalls("charges")
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
	defer func() { _ = locker.Rollback(b.ctx) }()
	_, err = locker.Exec(b.ctx, `LOCK TABLE onceflow_keys IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	pruner, err := sweeper.NewPruner(b.db, sweeper.PrunerConfig{QueryTimeout: 20 * time.Millisecond, Pause: -1})
	require.NoError(t, err)
	err = pruner.Run(b.ctx)
	require.ErrorContains(t, err, "timed out in a row")
	require.NoError(t, locker.Rollback(b.ctx))
	require.Equal(t, 50, b.count(t, `SELECT count(*) FROM onceflow_keys`))
}

// seedInterleaved is TestPruningWhileClaiming's table: $1 records of
// tenant "t", keys "k-000000"… in the order of i, each of a kind by i % 8,
// so that every kind neighbours the others in key order:
//
//   - due (0–4): finished two days ago, the pruner's work, in key order;
//   - recent (5): created two days ago but finished an hour ago (resumed
//     late, say): kept for the retention after finishing;
//   - held (6): in flight with an hour of lease left;
//   - expiring (7): in flight, its lease ended by hand while the pruner runs.
//
// Half the records in flight carry a completed_at among the due ones' (the
// schema no longer forbids it, since migration 0004): the pruner must go by
// status, not by that timestamp. The table seeded keeps each key's kind and
// first record id; pruned_log, the id and status of every row deleted.
var seedInterleaved = []string{`
CREATE TABLE seeded AS
SELECT i, 'k-' || lpad(i::text, 6, '0') AS key, gen_random_uuid() AS id,
    (ARRAY['due', 'due', 'due', 'due', 'due', 'recent', 'held', 'expiring'])[i % 8 + 1] AS kind
FROM generate_series(0, $1 - 1) i`, `
INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, owner, status, locked_until,
    response_status, response_body, created_at, updated_at, completed_at)
SELECT 't', s.key, s.id, 'op', $1, gen_random_uuid(),
    CASE WHEN s.kind IN ('due', 'recent') THEN 'completed' ELSE 'in_flight' END,
    CASE WHEN s.kind IN ('held', 'expiring') THEN clock_timestamp() + interval '1 hour' END,
    CASE WHEN s.kind IN ('due', 'recent') THEN 200 END,
    CASE WHEN s.kind IN ('due', 'recent') THEN 'seeded'::bytea END,
    o.old, o.old,
    CASE WHEN s.kind = 'recent' THEN now() - interval '1 hour'
         WHEN s.kind = 'due' OR (s.i / 8) % 2 = 0 THEN o.old + s.i * interval '1 millisecond' END
FROM seeded s, (SELECT now() - interval '2 days' AS old) o`, `
CREATE TABLE pruned_log (id uuid PRIMARY KEY, status text NOT NULL);
CREATE FUNCTION log_pruned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pruned_log SELECT id, status FROM gone;
    RETURN NULL;
END $$;
CREATE TRIGGER log_pruned AFTER DELETE ON onceflow_keys REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION log_pruned()`}

// seededKey is a row of the table seeded.
type seededKey struct {
	key  string
	id   uuid.UUID
	kind string
}

// pruneRace is TestPruningWhileClaiming's clients and what they saw.
type pruneRace struct {
	ctx   context.Context
	db    *pgxpool.Pool
	store *recovery.Store
	fp    recovery.Fingerprint

	expired atomic.Bool // the expiring keys' leases have ended
	done    atomic.Bool // the pruner has returned

	reclaimed, takenOver                  atomic.Int64
	firstReclaim, firstTakeover           chan struct{}
	reclaimOnce, takeoverOnce, expireOnce sync.Once

	mu       sync.Mutex
	problems []string
	failed   chan struct{} // closed at the first problem
}

// problem notes a claim that went wrong.
func (r *pruneRace) problem(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.problems = append(r.problems, err.Error()); len(r.problems) == 1 {
		close(r.failed)
	}
}

// expire ends the leases of the expiring keys, once.
func (r *pruneRace) expire() {
	r.expireOnce.Do(func() {
		_, err := r.db.Exec(r.ctx, `UPDATE onceflow_keys SET locked_until = clock_timestamp() - interval '1 millisecond'
			WHERE key IN (SELECT key FROM seeded WHERE kind = 'expiring')`)
		if err != nil {
			r.problem(fmt.Errorf("expire leases: %w", err))
		}
		r.expired.Store(true)
	})
}

// afterFirstBatch ends the expiring leases, then waits until a key has been
// reused and a record taken over. It reports whether both happened.
func (r *pruneRace) afterFirstBatch() bool {
	r.expire()
	for _, first := range []chan struct{}{r.firstReclaim, r.firstTakeover} {
		select {
		case <-first:
		case <-r.failed:
			return false
		case <-time.After(time.Minute):
			r.problem(errors.New("no key was reused or taken over after the first batch"))
			return false
		}
	}
	return true
}

// visitAll visits keys from workers goroutines, each taking every
// workers-th group of eight, in key order, and returns a wait for them.
func (r *pruneRace) visitAll(keys []seededKey, workers int) (wait func()) {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i, s := range keys {
				if (i/8)%workers != w {
					continue
				}
				if err := r.visit(s); err != nil {
					r.problem(err)
				}
			}
		})
	}
	return wg.Wait
}

func (r *pruneRace) claim(key string) (*recovery.Record, recovery.Outcome, error) {
	return r.store.Claim(r.ctx, recovery.ClaimParams{Key: recovery.Key{Tenant: "t", ID: key}, Workflow: "op",
		Fingerprint: r.fp})
}

// visit claims s.key as a client would and checks the answer against its
// kind.
func (r *pruneRace) visit(s seededKey) error {
	switch s.kind {
	case "due":
		return r.reuse(s)
	case "expiring":
		return r.takeOver(s)
	case "held":
		if _, outcome, err := r.claim(s.key); !errors.Is(err, recovery.ErrInFlight) {
			return fmt.Errorf("%s (held): claim gave %v, %v; want in flight", s.key, outcome, err)
		}
	case "recent":
		rec, outcome, err := r.claim(s.key)
		if err != nil || outcome != recovery.OutcomeReplay || rec.ID != s.id {
			return fmt.Errorf("%s (recent): claim gave %v, %v; want a replay of its record", s.key, outcome, err)
		}
	}
	return nil
}

// reuse claims a due key until its record is pruned, then checks that the
// key starts a new record that never gives way to the pruned one.
func (r *pruneRace) reuse(s seededKey) error {
	for {
		pruned := r.done.Load()
		rec, outcome, err := r.claim(s.key)
		if errors.Is(err, recovery.ErrInFlight) {
			// The pruner's uncommitted delete holds the row: a claim does
			// not wait for it (it waits no longer than for a first phase)
			// and is told to retry shortly, as a client would.
			continue
		}
		if err != nil {
			return fmt.Errorf("%s (due): claim: %w", s.key, err)
		}
		if outcome == recovery.OutcomeNew {
			if rec.ID == s.id {
				return fmt.Errorf("%s (due): the new record has the pruned one's id", s.key)
			}
			return r.finishNew(s, rec)
		}
		if outcome != recovery.OutcomeReplay || rec.ID != s.id || string(rec.Response.Body) != "seeded" {
			return fmt.Errorf("%s (due): claim gave %v of record %s, want a replay of %s or a new record",
				s.key, outcome, rec.ID, s.id)
		}
		if pruned {
			return fmt.Errorf("%s (due): the pruner returned and the record is still there", s.key)
		}
	}
}

// finishNew checks that a new record holds its key, completes it, and
// checks that the key now replays it.
func (r *pruneRace) finishNew(s seededKey, rec *recovery.Record) error {
	r.reclaimed.Add(1)
	if _, outcome, err := r.claim(s.key); !errors.Is(err, recovery.ErrInFlight) {
		return fmt.Errorf("%s (reused): a second claim gave %v, %v; want in flight", s.key, outcome, err)
	}
	if err := r.store.Complete(r.ctx, rec.Fence(), recovery.Response{Status: 201, Body: []byte("new")}); err != nil {
		return fmt.Errorf("%s (reused): complete: %w", s.key, err)
	}
	again, outcome, err := r.claim(s.key)
	if err != nil || outcome != recovery.OutcomeReplay || again.ID != rec.ID || string(again.Response.Body) != "new" {
		return fmt.Errorf("%s (reused): claim gave %v, %v; want a replay of the new record", s.key, outcome, err)
	}
	r.reclaimOnce.Do(func() { close(r.firstReclaim) })
	return nil
}

// takeOver claims an expiring key until its lease has ended, takes the
// record over and completes it.
func (r *pruneRace) takeOver(s seededKey) error {
	for {
		expired := r.expired.Load()
		rec, outcome, err := r.claim(s.key)
		if errors.Is(err, recovery.ErrInFlight) && !expired {
			continue
		}
		if err != nil || outcome != recovery.OutcomeTakeover || rec.ID != s.id {
			return fmt.Errorf("%s (expiring): claim gave %v, %v; want a takeover of %s", s.key, outcome, err, s.id)
		}
		if err := r.store.Complete(r.ctx, rec.Fence(), recovery.Response{Status: 201, Body: []byte("taken over")}); err != nil {
			return fmt.Errorf("%s (expiring): complete: %w", s.key, err)
		}
		r.takenOver.Add(1)
		r.takeoverOnce.Do(func() { close(r.firstTakeover) })
		return nil
	}
}

// gatedObserver runs afterFirst, once, after the pruner's first batch of
// keys, holding the pruner there until it returns (on purpose: an Observer
// is otherwise to be quick).
type gatedObserver struct {
	*recorder
	once       sync.Once
	afterFirst func()
}

func (g *gatedObserver) Pruned(table string, rows int) {
	g.recorder.Pruned(table, rows)
	if table == "onceflow_keys" {
		g.once.Do(g.afterFirst)
	}
}

// TestPruningWhileClaiming: the pruner works through 100k records while
// clients claim keys in the same neighbourhood, in key order and in the
// finished index: due keys claimed again the moment their record goes,
// records in flight beside them (some carrying an old completed_at), leases
// ending mid-run and taken over, new records completing. After its first
// batch the pruner waits until one key has been reused and one record taken
// over and completed, so both happen while it still has work.
//
// Every claim gets a replay of the record as it was, a new record (with a
// new id, after which the pruned record never comes back), a takeover, or
// "in flight"; the rows deleted are exactly the due ones.
func TestPruningWhileClaiming(t *testing.T) {
	b := setup(t)
	const records = 100_000
	fp := recovery.FingerprintBytes("op", nil)
	for i, args := range [][]any{{records}, {fp[:]}, nil} {
		_, err := b.db.Exec(b.ctx, seedInterleaved[i], args...)
		require.NoError(t, err)
	}
	store, err := recovery.New(b.db, recovery.Config{})
	require.NoError(t, err)
	r := &pruneRace{ctx: b.ctx, db: b.db, store: store, fp: fp,
		firstReclaim: make(chan struct{}), firstTakeover: make(chan struct{}), failed: make(chan struct{})}
	midRun := false
	obs := &gatedObserver{recorder: newRecorder(), afterFirst: func() { midRun = r.afterFirstBatch() }}

	// Clients visit every kind in every sixteenth group of eight keys.
	var visits []seededKey
	rows, err := b.db.Query(b.ctx, `SELECT key, id, kind FROM seeded WHERE (i / 8) % 16 = 0 ORDER BY key`)
	require.NoError(t, err)
	for rows.Next() {
		var s seededKey
		require.NoError(t, rows.Scan(&s.key, &s.id, &s.kind))
		visits = append(visits, s)
	}
	require.NoError(t, rows.Err())
	wait := r.visitAll(visits, 4)

	// The pause between batches lets the clients keep up with the pruner's
	// front, where its deletes and their claims meet.
	pruner, err := sweeper.NewPruner(b.db, sweeper.PrunerConfig{BatchSize: 1000, Pause: 10 * time.Millisecond, Observer: obs})
	require.NoError(t, err)
	started := time.Now()
	err = pruner.Run(b.ctx)
	took := time.Since(started)
	r.expire() // should the pruner not have reported a batch
	r.done.Store(true)
	wait()
	require.NoError(t, err)
	t.Logf("pruned %d records in %s while clients reused %d keys and took over %d records",
		obs.pruned["onceflow_keys"], took.Round(time.Millisecond), r.reclaimed.Load(), r.takenOver.Load())

	require.Empty(t, r.problems[:min(len(r.problems), 10)], "%d claims went wrong; the first ten:", len(r.problems))
	require.True(t, midRun, "a key was reused and a record taken over while the pruner had work left")
	seeded := b.countBy(t, `SELECT kind, count(*) FROM seeded GROUP BY kind`)
	visited := map[string]int{}
	for _, s := range visits {
		visited[s.kind]++
	}
	require.Equal(t, map[string]int{"due": seeded["due"]},
		b.countBy(t, `SELECT coalesce(s.kind, 'a new record'), count(*) FROM pruned_log l LEFT JOIN seeded s USING (id) GROUP BY 1`),
		"the pruner deleted every due record and nothing else")
	require.Equal(t, seeded["due"], obs.pruned["onceflow_keys"])
	require.Equal(t, map[string]int{"recent": seeded["recent"], "held": seeded["held"], "expiring": seeded["expiring"]},
		b.countBy(t, `SELECT s.kind, count(*) FROM onceflow_keys k JOIN seeded s USING (id) GROUP BY 1`),
		"every record not due is still there, under its id")
	require.Equal(t, map[string]int{"due": visited["due"]},
		b.countBy(t, `SELECT s.kind, count(*) FROM onceflow_keys k JOIN seeded s USING (key)
			WHERE k.id <> s.id AND k.status = 'completed' AND k.response_body = 'new' GROUP BY 1`),
		"each reused key holds its new record")
	require.EqualValues(t, visited["due"], r.reclaimed.Load())
	require.EqualValues(t, visited["expiring"], r.takenOver.Load())
	require.Equal(t, map[string]int{"held": seeded["held"], "expiring": seeded["expiring"] - visited["expiring"]},
		b.countBy(t, `SELECT s.kind, count(*) FROM onceflow_keys k JOIN seeded s USING (id) WHERE k.status = 'in_flight' GROUP BY 1`),
		"the records in flight nobody took over are still in flight")
}

// countBy runs sql, which returns (name, count) rows, and returns them as a
// map.
func (b *bundle) countBy(t *testing.T, sql string) map[string]int {
	t.Helper()
	rows, err := b.db.Query(b.ctx, sql)
	require.NoError(t, err)
	got := map[string]int{}
	for rows.Next() {
		var name string
		var n int
		require.NoError(t, rows.Scan(&name, &n))
		got[name] = n
	}
	require.NoError(t, rows.Err())
	return got
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
		_, err = wf.Run(ctx, e, workflow.Key{Tenant: "acme", ID: "died-1"}, Order{Amount: 100})
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
