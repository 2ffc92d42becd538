package systemtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/faults"
	"github.com/onceflow/onceflow/internal/pgcluster"
)

// dbfaultLease is the lease of the servers under database faults: short, so
// that an attempt cut off from the database loses its key soon.
const dbfaultLease = time.Second

// dbfaultMargin is how long past the lease a record may stay in flight once
// the faults stop. A record whose attempt lost its connection without
// handing the lease back waits out the lease; its client then waits for
// Retry-After, which is whole seconds and at least one (up to a second past
// the lease), plus idemclient's jitter (up to 20ms and a tenth of it), and
// the resumed attempt runs its remaining steps on a shared 2-core machine
// (the rest of the second, generously). The sweeper, every half second, may
// be the one that gets there first.
const dbfaultMargin = 2 * time.Second

// TestConnectionLossUnderLoad: onceflow's connections are terminated at
// random moments (pg_terminate_backend) while clients check out
// concurrently and retry on errors. Every checkout completes exactly once:
// one order and one charge per key, every retry answered with the bytes of
// the first final answer; the server survives; and once the faults stop, no
// record stays in flight longer than the lease and a small margin.
func TestConnectionLossUnderLoad(t *testing.T) {
	rnd := faults.Rand(t)
	e := newEnv(t)
	app := e.serve("--lease", dbfaultLease.String(), "--sweep-every", "500ms")
	dbfaultExplain(t, e.dbURL, app)
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Minute)
	defer cancel()

	rounds := faults.Size(48, 480)
	gaps := make([]time.Duration, rounds)
	var window time.Duration
	for i := range gaps {
		gaps[i] = rnd.Duration(10*time.Millisecond, 80*time.Millisecond)
		window += gaps[i]
	}
	keys := dbfaultKeys("conn", faults.Size(100, 1000))
	starts := make([]time.Duration, len(keys))
	for i := range starts {
		starts[i] = rnd.Duration(0, window*3/4) // every key starts while the faults go on
	}

	// Straight to PostgreSQL, past any PgBouncer: the killer must keep one
	// server session of its own, or it could end the one it runs on.
	killer := dbfaultConnect(t, dbtest.DirectURL(t, e.dbURL))
	d := dbfaultDriver(t, 3*time.Minute)
	stats := &d.stats
	var (
		clients sync.WaitGroup
		begin   = time.Now()
	)
	for i, k := range keys {
		clients.Go(func() {
			time.Sleep(starts[i]) // the client's moment to arrive, not a synchronisation
			dbfaultCheckout(ctx, d, app.URL, k, nil)
		})
	}
	var terminated, emptyRounds int
	for _, gap := range gaps {
		time.Sleep(gap) // the seeded moment of the next fault
		n, err := dbfaultTerminate(ctx, killer, rnd)
		require.NoError(t, err)
		terminated += n
		if n == 0 {
			emptyRounds++
		}
	}
	faultsStopped := time.Now()
	inFlightAtStop := dbfaultCount(t, killer, `SELECT count(*) FROM onceflow_keys WHERE status = 'in_flight'`)

	// Every key completes, and no record outlives the faults by more than
	// the lease and the margin.
	var recovery time.Duration
	dbfaultPoll(t, 2*time.Minute, 20*time.Millisecond, "records in flight two minutes after the faults stopped", func() bool {
		done := dbfaultCount(t, killer, `SELECT count(*) FROM onceflow_keys WHERE status <> 'in_flight'`)
		recovery = time.Since(faultsStopped)
		return done == len(keys)
	})
	dbfaultWait(t, &clients, time.Minute)
	t.Logf("%d fault rounds over %s terminated %d backends (%d rounds found none); %d keys, %d retryable answers "+
		"(%d transport errors, %d 409, %d 5xx); %d records in flight when the faults stopped, all finished %s later",
		rounds, faultsStopped.Sub(begin).Round(time.Millisecond), terminated, emptyRounds, len(keys), stats.retryable(),
		stats.transport.Load(), stats.conflicts.Load(), stats.serverErrors.Load(), inFlightAtStop, recovery.Round(time.Millisecond))

	require.GreaterOrEqual(t, terminated, rounds/2, "the faults hit onceflow's connections")
	require.Positive(t, stats.serverErrors.Load()+stats.transport.Load(), "the clients felt the faults")
	require.Zero(t, stats.timeouts.Load(), "no request hung")
	require.LessOrEqual(t, recovery, dbfaultLease+dbfaultMargin,
		"a record stayed in flight longer than the lease and the margin after the faults stopped")
	dbfaultAlive(t, app)
	dbfaultVerify(t, e, d, app, keys)
}

// TestPostgresRestart: the database server stops mid-run for a seeded 0-5s
// and starts again. The checkout server survives the outage on its own;
// clients that retry complete their checkouts; checkouts whose clients gave
// up are completed by the sweeper alone (among them, always, a witness
// whose charge is held through the outage and whose client gives up during
// it), and a late retry gets the stored answer (Idempotent-Replayed: true). Every record completes, with one order
// and one charge per key and one answer per key, byte for byte.
func TestPostgresRestart(t *testing.T) {
	rnd := faults.Rand(t)
	e := newEnv(t) // the provider process; the database is a cluster of the test's own
	cluster, err := pgcluster.Start(e.ctx, pgcluster.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	e.dbURL = cluster.URL()
	// The first charge request, the witness's, waits at the proxy until the
	// database has restarted; every other one goes straight through.
	proxy := killNewProxy(t, e.provider, 1)
	app := e.serve("--provider-url", proxy.url, "--lease", dbfaultLease.String(), "--sweep-every", "500ms") // serve migrates on start
	dbfaultExplain(t, e.dbURL, app)
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Minute)
	defer cancel()

	// The witness: a checkout in flight through the whole outage whose
	// client gives up during it, so that only the sweeper can finish it.
	witness := dbfaultNewKey("witness", 9000) // an amount no other key has
	witnessCtx, witnessGivesUp := context.WithCancel(ctx)
	defer witnessGivesUp()
	type witnessEnd struct {
		a   answer
		err error
	}
	witnessDone := make(chan witnessEnd, 1)
	go func() {
		a, err := dbfaultPost(witnessCtx, app.URL, witness)
		witnessDone <- witnessEnd{a, err}
	}()
	select {
	case <-proxy.gates[0].arrived:
	case end := <-witnessDone:
		t.Fatalf("the witness's checkout ended before its charge: %d %v", end.a.status, end.err)
	}

	d := dbfaultDriver(t, 3*time.Minute)
	stats := &d.stats
	var (
		mu       sync.Mutex
		keys     []*dbfaultKey
		next     atomic.Int64
		answered atomic.Int64
		halted   atomic.Bool
		enough   = make(chan struct{}) // closed when no more keys should start
		workers  sync.WaitGroup
	)
	giveUp := halted.Load // errors come from the outage
	for range 16 {
		workers.Go(func() {
			for {
				select {
				case <-enough:
					return
				default:
				}
				i := int(next.Add(1)) - 1
				k := dbfaultNewKey("restart", i)
				k.givesUp = rnd.IntN(5) < 2 // a seeded two fifths of the clients give up after an error
				mu.Lock()
				keys = append(keys, k)
				mu.Unlock()
				dbfaultCheckout(ctx, d, app.URL, k, giveUp)
				if k.first != nil {
					answered.Add(1)
				}
			}
		})
	}

	minKeys := faults.Size(50, 500)
	haltAfter := int64(5 + rnd.IntN(minKeys/3))
	down := rnd.Duration(0, 5*time.Second)
	require.Eventually(t, func() bool { return answered.Load() >= haltAfter }, time.Minute, 5*time.Millisecond)
	halted.Store(true)
	inFlightAtHalt := dbfaultCount(t, dbfaultConnect(t, cluster.URL()), `SELECT count(*) FROM onceflow_keys WHERE status = 'in_flight'`)
	require.NoError(t, cluster.Halt())
	witnessGivesUp()
	// The witness's client ends with no final answer: it gave up, or, when
	// halting took longer than the lease, the server had already told it to
	// retry (its attempt's lease ran out with the database down).
	if end := <-witnessDone; end.err == nil {
		require.True(t, end.a.status == http.StatusConflict || end.a.status >= 500,
			"the witness's client has no final answer, got %d %s", end.a.status, end.a.body)
	}
	time.Sleep(down) // the outage itself
	require.NoError(t, cluster.Resume(ctx))
	proxy.gates[0].release()
	startedAtResume := int(next.Load())
	require.Eventually(t, func() bool { return int(next.Load()) >= max(minKeys, startedAtResume+10) },
		time.Minute, 5*time.Millisecond, "new checkouts start after the restart")
	close(enough)
	dbfaultWait(t, &workers, 2*time.Minute)
	dbfaultAlive(t, app)

	// Clients that gave up left their records to the sweeper alone.
	db := dbfaultConnect(t, cluster.URL())
	var sweeperOnly, neverStarted []*dbfaultKey
	for _, k := range keys {
		if k.first != nil {
			continue
		}
		require.True(t, k.givesUp, "key %s: a retrying client ends with an answer", k.id)
		if dbfaultCount(t, db, `SELECT count(*) FROM onceflow_keys WHERE key = $1`, k.id) == 1 {
			sweeperOnly = append(sweeperOnly, k)
		} else {
			neverStarted = append(neverStarted, k)
		}
	}
	dbfaultPoll(t, time.Minute, 50*time.Millisecond, "the sweeper completes the records whose clients gave up", func() bool {
		return dbfaultCount(t, db, `SELECT count(*) FROM onceflow_keys WHERE status <> 'completed'`) == 0
	})
	// The witness's record outlived the outage in flight, with no client:
	// the sweeper finished it.
	sweeperOnly = append(sweeperOnly, witness)
	keys = append(keys, witness)
	// Each was completed by the sweeper, as its log says, unless its first
	// attempt's completion committed as the server went down and only the
	// acknowledgement was lost: then no attempt was ever taken over
	// (attempts 0) and the sweeper had nothing left. The sweeper logs after
	// its commit, so the log is read until it says so or a bound passes.
	ownCommit := map[string]bool{}
	for _, k := range sweeperOnly {
		ownCommit[k.id] = dbfaultCount(t, db, `SELECT count(*) FROM onceflow_keys WHERE key = $1 AND attempts = 0`, k.id) == 1
	}
	var swept map[string]bool
	unlogged := func() []string {
		swept = dbfaultSwept(app.Stderr())
		var missing []string
		for _, k := range sweeperOnly {
			if !swept[k.id] && !ownCommit[k.id] {
				missing = append(missing, k.id)
			}
		}
		return missing
	}
	dbfaultPoll(t, time.Minute, 50*time.Millisecond, "the sweeper logs each record it completed", func() bool {
		return len(unlogged()) == 0
	})
	for _, k := range sweeperOnly {
		require.True(t, swept[k.id] || ownCommit[k.id], "key %s: completed by the sweeper, as its log says", k.id)
		late, err := dbfaultPost(ctx, app.URL, k)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, late.status, "%s", late.body)
		require.Equal(t, "true", late.replayed, "key %s: the sweeper's answer is replayed", k.id)
		k.first = &late
	}
	for _, k := range neverStarted {
		// The outage cut the request off before its first commit: nothing
		// happened, and a retry is a first execution.
		k.givesUp = false
		dbfaultCheckout(ctx, d, app.URL, k, nil)
		require.NotNil(t, k.first, "key %s", k.id)
		require.Empty(t, k.first.replayed, "key %s had no record to replay", k.id)
	}
	t.Logf("outage %s after %d answers (%d records in flight at the halt); %d keys: %d gave up, of which the sweeper "+
		"finished %d and %d had never started; %d retryable answers (%d transport errors, %d 409, %d 5xx)",
		down.Round(time.Millisecond), haltAfter, inFlightAtHalt, len(keys), len(sweeperOnly)+len(neverStarted),
		len(sweeperOnly), len(neverStarted), stats.retryable(), stats.transport.Load(), stats.conflicts.Load(),
		stats.serverErrors.Load())
	require.Positive(t, stats.serverErrors.Load()+stats.transport.Load(), "the clients felt the outage")
	require.Zero(t, stats.timeouts.Load(), "no request hung")
	dbfaultVerify(t, e, d, app, keys)
}

// dbfaultKey is one checkout: its key, its request, and what its client
// got.
type dbfaultKey struct {
	id      string
	amount  int64 // unique per key, to find its charge at the provider
	body    string
	givesUp bool    // the client stops after an error
	first   *answer // the first final answer; nil if the client gave up
}

func dbfaultNewKey(prefix string, i int) *dbfaultKey {
	id := fmt.Sprintf("%s-%04d", prefix, i)
	amount := int64(1000 + i)
	return &dbfaultKey{id: id, amount: amount, body: fmt.Sprintf(
		`{"customer_id":"cus_%s","amount_cents":%d,"currency":"usd","card_token":"tok_visa","items":[{"sku":"book","qty":1}]}`,
		id, amount)}
}

func dbfaultKeys(prefix string, n int) []*dbfaultKey {
	keys := make([]*dbfaultKey, n)
	for i := range keys {
		keys[i] = dbfaultNewKey(prefix, i)
	}
	return keys
}

// dbfaultHTTP gives up on a request after 30s: a server that holds a
// request that long under database faults hangs, and the test says so.
var dbfaultHTTP = &http.Client{Timeout: 30 * time.Second}

// dbfaultDriver is the clients of the database fault suites: an attempt
// that takes 30s hangs (dbfaultHTTP), and the backoff is a random pause of
// up to 20ms doubled with each retry, at most 200ms, or Retry-After, until
// bound.
func dbfaultDriver(t *testing.T, bound time.Duration) *driver {
	return newDriver(t, driveConfig{maxElapsed: bound, timeout: dbfaultHTTP.Timeout,
		baseDelay: 20 * time.Millisecond, maxDelay: 200 * time.Millisecond, conns: 16})
}

// dbfaultPost sends k once, with no retry.
func dbfaultPost(ctx context.Context, base string, k *dbfaultKey) (answer, error) {
	return post(ctx, dbfaultHTTP, base, k.id, k.body)
}

// dbfaultCheckout sends k through the driver's client, which retries a
// transport error, a 409 or a 5xx until it gets a final answer, k.first.
// A client that gives up (k.givesUp) stops after a retryable answer if
// giveUp (nil: never) says so, leaving k.first nil.
func dbfaultCheckout(ctx context.Context, d *driver, base string, k *dbfaultKey, giveUp func() bool) {
	if k.givesUp && giveUp != nil {
		var stop context.CancelFunc
		ctx, stop = context.WithCancel(ctx)
		defer stop()
		defer d.onRetryable(k.id, func() {
			if giveUp() {
				stop() // before the retry is sent
			}
		})()
	}
	if a, err := d.post(ctx, base, k.id, k.body); err == nil {
		k.first = &a
	}
}

// dbfaultTerminate ends one to three random backends of the test database,
// the caller's own excepted, and returns how many it ended.
func dbfaultTerminate(ctx context.Context, conn *pgx.Conn, rnd *faults.Source) (int, error) {
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
		ORDER BY pid`)
	if err != nil {
		return 0, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		return 0, err
	}
	terminated := 0
	for _, i := range rnd.Perm(len(pids))[:1+rnd.IntN(min(3, len(pids)))] {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pids[i]).Scan(&ok); err != nil {
			return terminated, err
		}
		if ok {
			terminated++
		}
	}
	return terminated, nil
}

func dbfaultConnect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func dbfaultCount(t *testing.T, conn *pgx.Conn, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, conn.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// dbfaultExplain logs, when t fails, the records still in flight and the
// server's log, which tell why.
func dbfaultExplain(t *testing.T, url string, app *serveProcess) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(ctx, url); err == nil {
			defer conn.Close(ctx)
			rows, _ := conn.Query(ctx, `SELECT key, coalesce(recovery_point, ''), locked_until::text, attempts,
				coalesce(last_error, ''), updated_at::text, clock_timestamp()::text
				FROM onceflow_keys WHERE status = 'in_flight'`)
			var key, point, until, lastErr, updated, now string
			var attempts int
			_, err := pgx.ForEachRow(rows, []any{&key, &point, &until, &attempts, &lastErr, &updated, &now}, func() error {
				t.Logf("in flight: %s after %q, locked until %s, updated %s (now %s), %d attempts, last error %q",
					key, point, until, updated, now, attempts, lastErr)
				return nil
			})
			if err != nil {
				t.Logf("records in flight: %v", err)
			}
		}
		t.Logf("checkout serve log:\n%s", app.Stderr())
	})
}

// dbfaultPoll calls cond every interval until it holds, failing the test
// with msg after timeout. It polls on the test's goroutine, so cond may
// fail the test itself.
func dbfaultPoll(t *testing.T, timeout, interval time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, msg)
		}
		time.Sleep(interval)
	}
}

// dbfaultWait waits for wg, failing the test after timeout.
func dbfaultWait(t *testing.T, wg *sync.WaitGroup, timeout time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		t.Fatalf("clients still waiting for answers after %s", timeout)
	}
}

// dbfaultAlive fails the test if the server process has exited.
func dbfaultAlive(t *testing.T, p *serveProcess) {
	t.Helper()
	select {
	case <-p.Done():
		t.Fatalf("checkout serve exited (%v): %s", p.Proc.Err(), p.Stderr())
	default:
	}
}

var dbfaultSweptLine = regexp.MustCompile(`msg="completed an abandoned record".* key=(\S+)`)

// dbfaultSwept returns the keys the server's sweeper says it completed.
func dbfaultSwept(log string) map[string]bool {
	swept := map[string]bool{}
	for _, m := range dbfaultSweptLine.FindAllStringSubmatch(log, -1) {
		swept[m[1]] = true
	}
	return swept
}

// dbfaultVerify checks what every key's first final answer says against
// the database and the provider: each key's record completed with a 201,
// one paid order per key and no other, one charge per key and no other,
// both named in the answer; and a retry of each key replays the answer
// byte for byte.
func dbfaultVerify(t *testing.T, e *env, d *driver, app *serveProcess, keys []*dbfaultKey) {
	t.Helper()
	conn := dbfaultConnect(t, e.dbURL)
	type order struct{ id, status, chargeID string }
	orders := map[string][]order{}
	rows, err := conn.Query(e.ctx, `SELECT customer_id, id, status, coalesce(charge_id, '') FROM checkout_orders`)
	require.NoError(t, err)
	var customer string
	var o order
	_, err = pgx.ForEachRow(rows, []any{&customer, &o.id, &o.status, &o.chargeID}, func() error {
		orders[customer] = append(orders[customer], o)
		return nil
	})
	require.NoError(t, err)
	records := map[string]string{}
	rows, err = conn.Query(e.ctx, `SELECT key, status || ' ' || coalesce(response_status, 0) FROM onceflow_keys WHERE tenant_id = 'acme'`)
	require.NoError(t, err)
	var key, record string
	_, err = pgx.ForEachRow(rows, []any{&key, &record}, func() error { records[key] = record; return nil })
	require.NoError(t, err)
	charges := map[int64][]Charge{}
	for _, c := range e.charges() {
		charges[c.AmountCents] = append(charges[c.AmountCents], c)
	}

	require.Len(t, records, len(keys), "one record per key")
	require.Len(t, orders, len(keys), "orders for these keys' customers only")
	require.Len(t, charges, len(keys), "charges for these keys' amounts only")
	for _, k := range keys {
		require.NotNil(t, k.first, "key %s has a final answer", k.id)
		require.Equal(t, http.StatusCreated, k.first.status, "key %s: %s", k.id, k.first.body)
		var paid struct {
			OrderID  string `json:"order_id"`
			ChargeID string `json:"charge_id"`
			Status   string `json:"status"`
		}
		require.NoError(t, json.Unmarshal(k.first.body, &paid), "%s", k.first.body)
		require.Equal(t, "completed 201", records[k.id], "key %s", k.id)
		require.Equal(t, []order{{paid.OrderID, "paid", paid.ChargeID}}, orders["cus_"+k.id], "key %s: one paid order, the answer's", k.id)
		require.Len(t, charges[k.amount], 1, "key %s: one charge", k.id)
		require.Equal(t, charges[k.amount][0].ID, paid.ChargeID, "key %s: the answer names the charge", k.id)

		// Through the client: a pooled connection that a fault ended while
		// idle fails the first statement sent on it, which onceflow answers
		// with 503 (fail closed, nothing run), and the client retries.
		again, err := d.post(e.ctx, app.URL, k.id, k.body)
		require.NoError(t, err)
		require.Equal(t, k.first.status, again.status, "key %s", k.id)
		require.Equal(t, string(k.first.body), string(again.body), "key %s: a retry gets the first final answer, byte for byte", k.id)
		require.Equal(t, "true", again.replayed, "key %s", k.id)
	}
}
