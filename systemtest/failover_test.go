package systemtest

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemclient"
	"github.com/onceflow/onceflow/internal/faults"
	"github.com/onceflow/onceflow/internal/pgha"
)

// failoverBound bounds each step of a failover: the promotion, the old
// primary's rejoin. pg_auto_failover's monitor, as pgha tunes it, promotes
// within seconds.
const failoverBound = time.Minute

// failoverWorkers is how many clients send checkouts at once; each waits
// a random pause of up to failoverGap before its next checkout: a modest,
// steady load (about a hundred checkouts a second at most).
const (
	failoverWorkers = 8
	failoverGap     = 100 * time.Millisecond
)

// TestFailoverUnderLoad: the checkout service, two server processes with
// their sweepers, runs on a pg_auto_failover formation with synchronous
// replication, through its multi-host URL, under a steady stream of
// checkouts that clients retry. At seeded moments the primary's node is
// killed (SIGKILL of its keeper and every PostgreSQL process); the monitor
// promotes the standby, and the old primary rejoins as its standby. Once
// in CI; three times with ONCEFLOW_LONG=1.
//
// Nothing acknowledged is lost and nothing is repeated: every key completed
// with one order and one charge, every answer a client got is the one a
// retry replays, byte for byte. The servers are never restarted: their
// pools find the new primary. During the switch, clients see connection
// errors and 5xx (every 503 with Retry-After) and no request hangs; the
// records in flight when the primary died are finished within the lease
// and a margin of the promotion.
func TestFailoverUnderLoad(t *testing.T) {
	rnd := faults.Rand(t)
	r := newFailoverRun(t, rnd)
	failovers := faults.Size(1, 3)
	var seen []failoverSeen
	for range failovers {
		r.awaitAnswers(int64(20 + rnd.IntN(40)))
		time.Sleep(rnd.Duration(0, 100*time.Millisecond)) // the seeded moment, not a synchronisation
		seen = append(seen, r.failover(r.holdCharge()))
	}
	r.awaitAnswers(30) // the load goes on on the last primary
	r.stop()

	for i, s := range seen {
		t.Logf("failover %d: %s", i+1, s)
	}
	st := &r.d.stats
	t.Logf("%d failovers, %d keys; %d attempts: %d transport errors, %d 409, %d 5xx (%d 503, %d of them without Retry-After)",
		failovers, len(r.keys), st.attempts.Load(), st.transport.Load(), st.conflicts.Load(), st.serverErrors.Load(),
		r.unavailable.Load(), r.unavailableBare.Load())
	require.Positive(t, st.transport.Load()+st.serverErrors.Load(), "the clients felt the failovers")
	require.Zero(t, st.timeouts.Load(), "no request hung")
	require.Zero(t, r.unavailableBare.Load(), "every 503 says when to retry (Retry-After)")
	for _, app := range r.apps {
		dbfaultAlive(t, app) // the same processes throughout: their pools recovered
	}
	keys := make([]*dbfaultKey, len(r.keys))
	for i, k := range r.keys {
		keys[i] = k.dbfaultKey
	}
	dbfaultVerify(t, r.e, r.d, r.apps[0], keys)
}

// failoverRun is the checkout service on a formation under a steady load:
// clients start checkouts, one after another, until stop.
type failoverRun struct {
	t    *testing.T
	ctx  context.Context
	e    *env
	f    *pgha.Formation
	apps [2]*serveProcess
	d    *driver
	rnd  *faults.Source
	// proxy is the provider as the servers reach it: a failover holds a
	// charge there, so that a checkout is in flight through it.
	proxy *killProxy

	// unavailable counts the 503s the clients retried; unavailableBare,
	// those without Retry-After.
	unavailable, unavailableBare atomic.Int64
	watch                        switchWatch

	mu        sync.Mutex
	keys      []*failoverKey
	next      atomic.Int64
	answered  atomic.Int64
	paused    atomic.Bool  // keys started now start after PauseReplication
	pausedAck atomic.Int64 // answers to keys started after PauseReplication
	enough    chan struct{}
	workers   sync.WaitGroup
	cancel    context.CancelFunc
}

// failoverKey is one checkout of the load.
type failoverKey struct {
	*dbfaultKey
	afterPause bool      // started while the primary's WAL was held back
	startAt    time.Time // when its client sent it first
	ackAt      time.Time // when its client got its final answer
}

// newFailoverRun starts a formation, two checkout servers on it with
// serveArgs after the common ones, and the load.
func newFailoverRun(t *testing.T, rnd *faults.Source, serveArgs ...string) *failoverRun {
	e := newEnv(t)
	f, err := pgha.Start(e.ctx, pgha.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Stop() })
	e.dbURL = f.URL()
	ctx, cancel := context.WithTimeout(e.ctx, faults.Size(3*time.Minute, 10*time.Minute))
	r := &failoverRun{t: t, ctx: ctx, e: e, f: f, rnd: rnd, proxy: killNewProxy(t, e.provider, 0),
		enough: make(chan struct{}), cancel: cancel}
	args := append([]string{"--provider-url", r.proxy.url, "--lease", dbfaultLease.String(), "--sweep-every", "500ms"}, serveArgs...)
	for i := range r.apps {
		r.apps[i] = e.serve(args...) // the first migrates
		dbfaultExplain(t, e.dbURL, r.apps[i])
	}
	r.d = newDriver(t, driveConfig{maxElapsed: 2 * time.Minute, timeout: dbfaultHTTP.Timeout,
		baseDelay: 20 * time.Millisecond, maxDelay: 200 * time.Millisecond, conns: failoverWorkers,
		observe: idemclient.Hooks{Attempt: r.watch.attempt, Wait: r.waited}})
	for range failoverWorkers {
		r.workers.Go(r.work)
	}
	t.Cleanup(func() { r.cancel(); r.stop() })
	return r
}

// work sends new checkouts, each to one of the servers, until enough.
func (r *failoverRun) work() {
	for {
		select {
		case <-r.enough:
			return
		case <-time.After(r.rnd.Duration(0, failoverGap)): // the next client's arrival, not a synchronisation
		}
		i := int(r.next.Add(1)) - 1
		k := &failoverKey{dbfaultKey: dbfaultNewKey("failover", i), afterPause: r.paused.Load(), startAt: time.Now()}
		r.mu.Lock()
		r.keys = append(r.keys, k)
		r.mu.Unlock()
		dbfaultCheckout(r.ctx, r.d, r.apps[i%len(r.apps)].URL, k.dbfaultKey, nil)
		if k.first != nil {
			k.ackAt = time.Now()
			r.answered.Add(1)
			if k.afterPause {
				r.pausedAck.Add(1)
			}
		}
	}
}

// waited is the clients' Wait hook: it counts the 503s, and those without
// Retry-After.
func (r *failoverRun) waited(w idemclient.WaitInfo) {
	if w.Status == http.StatusServiceUnavailable {
		r.unavailable.Add(1)
		if w.RetryAfter <= 0 {
			r.unavailableBare.Add(1)
		}
	}
}

// awaitAnswers waits until the clients got n more answers.
func (r *failoverRun) awaitAnswers(n int64) {
	r.t.Helper()
	target := r.answered.Load() + n
	dbfaultPoll(r.t, time.Minute, 5*time.Millisecond, "checkouts to progress", func() bool { return r.answered.Load() >= target })
}

// stop ends the load and waits for the clients' last answers.
func (r *failoverRun) stop() {
	r.t.Helper()
	select {
	case <-r.enough:
		return
	default:
		close(r.enough)
	}
	dbfaultWait(r.t, &r.workers, 2*time.Minute)
}

// failoverSeen is what one failover took.
type failoverSeen struct {
	killing   time.Time     // when the kill began
	killedAt  time.Time     // when the node was gone
	promotion time.Duration // from the kill to the standby taking writes
	clients   time.Duration // from the first failed attempt to the first success after it
	inFlight  int           // records in flight at the kill
	drained   time.Duration // from the promotion until those were finished
	rejoin    time.Duration // from the rejoin until the old primary is a standby
}

func (s failoverSeen) String() string {
	return "promoted " + s.promotion.Round(time.Millisecond).String() + " after the kill; clients saw " +
		s.clients.Round(time.Millisecond).String() + " from their first failure to their first success; " +
		strconv.Itoa(s.inFlight) + " records in flight at the kill, finished " + s.drained.Round(time.Millisecond).String() +
		" after the promotion; old primary a standby " + s.rejoin.Round(time.Millisecond).String() + " after its rejoin"
}

// holdCharge holds the next checkout's charge at the proxy and returns
// once it is held: the checkout's order is committed, its record in
// flight.
func (r *failoverRun) holdCharge() *killGate {
	r.t.Helper()
	witness := r.proxy.holdNext()
	select {
	case <-witness.arrived:
	case <-time.After(time.Minute):
		r.t.Fatal("no charge request within a minute")
	}
	return witness
}

// failover kills the primary's node while witness holds a checkout's
// charge, so that its record is in flight through the failover; waits for
// the standby's promotion, then lets the charge go on and waits for the
// records in flight to finish; and has the old primary rejoin as the new
// standby.
func (r *failoverRun) failover(witness *killGate) failoverSeen {
	t := r.t
	t.Helper()
	// The records in flight now: the witness's, held, and others. Each is
	// finished within the lease and a margin of the promotion: the dead
	// primary's attempts lost their connections, their leases run out,
	// and a client's retry or a sweeper takes each over. (With
	// asynchronous replication, a record lost with the primary is not in
	// flight either.)
	db := dbfaultConnect(t, r.f.URL())
	rows, err := db.Query(r.ctx, `SELECT key FROM onceflow_keys WHERE status = 'in_flight'`)
	require.NoError(t, err)
	inFlight, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NoError(t, db.Close(r.ctx))
	require.NotEmpty(t, inFlight, "the held checkout's record is in flight")

	r.watch.arm()
	killing := time.Now()
	killed, err := r.f.KillPrimary(r.ctx, failoverBound)
	require.NoError(t, err)
	killedAt := time.Now()
	var promoted *pgha.Node
	for _, n := range r.f.Nodes() {
		if n != killed {
			promoted = n
		}
	}
	require.NoError(t, r.f.WaitPrimary(r.ctx, promoted, failoverBound))
	s := failoverSeen{killing: killing, killedAt: killedAt, promotion: time.Since(killedAt), inFlight: len(inFlight)}
	promotedAt := time.Now()
	witness.release()
	db = dbfaultConnect(t, r.f.URL())
	dbfaultPoll(t, time.Minute, 20*time.Millisecond, "the records in flight at the kill to finish", func() bool {
		return dbfaultCount(t, db, `SELECT count(*) FROM onceflow_keys WHERE status = 'in_flight' AND key = ANY($1)`, inFlight) == 0
	})
	s.drained = time.Since(promotedAt)
	require.LessOrEqual(t, s.drained, dbfaultLease+dbfaultMargin,
		"a record in flight at the kill stayed so longer than the lease and the margin after the promotion")

	rejoinedAt := time.Now()
	require.NoError(t, r.f.Rejoin(killed))
	require.NoError(t, r.f.WaitSecondary(r.ctx, killed, failoverBound))
	s.rejoin = time.Since(rejoinedAt)
	var ok bool
	s.clients, ok = r.watch.disarm()
	require.True(t, ok, "the clients saw a failure, then a success: %s", s.clients)
	return s
}

// switchWatch times a failover as the clients see it: from the first
// attempt that fails after it is armed to the first attempt sent after
// that which succeeds.
type switchWatch struct {
	mu                 sync.Mutex
	armed              bool
	firstFail, firstOK time.Time
}

func (w *switchWatch) arm() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed, w.firstFail, w.firstOK = true, time.Time{}, time.Time{}
}

// disarm returns the time from the first failure to the first success,
// and whether both were seen.
func (w *switchWatch) disarm() (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = false
	if w.firstFail.IsZero() || w.firstOK.IsZero() {
		return 0, false
	}
	return w.firstOK.Sub(w.firstFail), true
}

// attempt is the clients' Attempt hook.
func (w *switchWatch) attempt(a idemclient.AttemptInfo) {
	if errors.Is(a.Err, context.Canceled) {
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case !w.armed:
	case a.Err != nil || a.Status >= 500:
		if w.firstFail.IsZero() {
			w.firstFail = now
		}
	case a.Status < 300 && !w.firstFail.IsZero() && w.firstOK.IsZero() && now.Add(-a.Duration).After(w.firstFail):
		w.firstOK = now
	}
}
