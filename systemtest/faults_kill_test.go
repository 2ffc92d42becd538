package systemtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/faults"
	"github.com/onceflow/onceflow/internal/frontproxy"
	"github.com/onceflow/onceflow/recovery"
)

// TestSIGKILLUnderLoad kills the checkout server with SIGKILL at seeded
// random moments while hundreds of checkouts run, each time with work in
// flight, and starts a new one on the same database and provider. The
// clients, one idemclient.Client, reach the servers through a proxy with a
// fixed address and retry each key until it gets an answer; then every key
// is sent once more. It proves that a server dying anywhere in a checkout
// loses nothing and repeats nothing: every key ends completed with one order
// and one charge of its own amount, every retry gets the first answer byte
// for byte, and every checkout the dead server left in flight was taken
// over by a new attempt.
func TestSIGKILLUnderLoad(t *testing.T) {
	e := newEnv(t)
	rnd := faults.Rand(t)
	started := time.Now()
	n := faults.Size(200, 2000)
	kills := faults.Size(3+rnd.IntN(3), 6+rnd.IntN(4))
	const clients = 16
	t.Logf("seed %d: %d keys, %d clients, %d kills", rnd.Seed(), n, clients, kills)

	conn := killConnect(t, e)
	checkouts := killCheckouts(n)
	// The clients' one URL: the servers behind it restart on new ports.
	// While none listens, requests wait there for the next; a request the
	// killed server took with it ends with its connection closed, as it
	// would without the proxy.
	front := frontproxy.New(t, frontproxy.Config{Abort: true, MaxIdleConns: clients})
	bound := faults.Size(3*time.Minute, 10*time.Minute)
	// The clients retry a connection error or a 5xx soon (20ms at first),
	// a 409 after Retry-After, until the test's bound.
	load := newDriver(t, driveConfig{maxElapsed: bound, timeout: time.Minute,
		baseDelay: 20 * time.Millisecond, maxDelay: 2 * time.Second, conns: clients})
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	results := make([]killResult, n)
	var (
		wg      sync.WaitGroup
		settled atomic.Int64
		queue   = make(chan int, n)
		ended   = make(chan struct{})
	)
	for _, i := range rnd.Perm(n) {
		queue <- i
	}
	close(queue)
	for range clients {
		wg.Go(func() {
			for i := range queue {
				results[i].answer, results[i].err = load.post(ctx, front.URL, checkouts[i].key, checkouts[i].body)
				settled.Add(1)
			}
		})
	}
	go func() { wg.Wait(); close(ended) }()
	defer func() { cancel(); <-ended }() // on a failure, the clients give up before the servers stop

	serveArgs := []string{"--lease", "1s", "--sweep-every", "1s"}
	since := killNow(t, conn)
	app := e.serve(serveArgs...)
	require.NoError(t, front.Route(app.URL))
	frozen := map[killOwned]bool{} // key records left in flight by a killed server
	var frozenKeys, chargedBeforeKill int
	for i, at := range killThresholds(rnd, n, kills) {
		killUntil(t, ctx, ended, func() bool { return settled.Load() >= int64(at) }, "checkouts to progress")
		killPause(ctx, rnd.Duration(0, 25*time.Millisecond)) // a random moment
		inFlight := killAwaitWork(t, ctx, conn, since, func() bool { return settled.Load() >= int64(n) })

		front.Down()
		app.Kill() // SIGKILL
		killSettle(t, ctx, conn)
		newly := killFrozen(t, conn, frozen)
		charged := killChargedAlready(e.charges(), newly)
		frozenKeys += len(newly)
		chargedBeforeKill += charged
		t.Logf("kill %d: after %d of %d answers, %d checkouts in flight, %d left in flight (%d already charged)",
			i+1, settled.Load(), n, inFlight, len(newly), charged)

		since = killNow(t, conn)
		app = e.serve(serveArgs...)
		require.NoError(t, front.Route(app.URL))
	}
	killUntil(t, ctx, ended, func() bool { return false }, "every checkout to get an answer")

	answers := make(map[string]answer, n)
	for i, c := range checkouts {
		r := results[i]
		require.NoError(t, r.err, "key %s", c.key)
		require.Equal(t, http.StatusCreated, r.answer.status, "key %s: %s", c.key, r.answer.body)
		answers[c.key] = r.answer
	}
	killCheckAnswers(t, checkouts, answers)

	// Every key again, once, on the last server: the first answer, byte for
	// byte.
	probe := killClient(clients)
	for _, c := range checkouts {
		again, err := post(ctx, probe, app.URL, c.key, c.body)
		require.NoError(t, err, "key %s", c.key)
		first := answers[c.key]
		require.Equal(t, first.status, again.status, "key %s: %s", c.key, again.body)
		require.Equal(t, string(first.body), string(again.body), "key %s: a retry gets the first answer", c.key)
		require.Equal(t, first.contentType, again.contentType, "key %s", c.key)
		require.Equal(t, "true", again.replayed, "key %s", c.key)
	}

	records := killRecords(t, conn)
	takenOver := killCheckStorage(t, conn, checkouts, answers, records)
	killCheckCharges(t, e.charges(), checkouts, answers, records)
	require.NotZero(t, frozenKeys, "no kill caught a checkout in flight: the test proved nothing")
	for owned := range frozen {
		require.GreaterOrEqual(t, records[owned.key].attempts, 1,
			"key %s was left in flight by a killed server; the attempt that finished it must have taken it over", owned.key)
	}
	s := &load.stats
	// The proxy sees more requests than the client's attempts: a request
	// whose connection a kill closed unanswered is sent again by the
	// client's transport itself (it carries an Idempotency-Key), and waits
	// at the proxy for the next server.
	t.Logf("%d keys, %d kills, %d attempts (%d retries: %d connection errors, %d 409s, %d 5xx; %d requests at the proxy), "+
		"%d checkouts left in flight by a kill (a key once per kill; %d of them already charged), %d keys taken over, in %s",
		n, kills, s.attempts.Load(), s.attempts.Load()-int64(n), s.transport.Load(), s.conflicts.Load(), s.serverErrors.Load(),
		front.Requests(),
		frozenKeys, chargedBeforeKill, takenOver, time.Since(started).Round(time.Millisecond))
}

// killCheckout is one key's checkout. The customer, amount, currency and
// item differ by key, so that an answer, an order or a charge given to the
// wrong key shows.
type killCheckout struct {
	key, body, customer, currency string
	amount                        int64
}

func killCheckouts(n int) []killCheckout {
	currencies := []string{"usd", "eur", "gbp"}
	out := make([]killCheckout, n)
	for i := range out {
		c := killCheckout{key: fmt.Sprintf("kill-%04d", i), customer: fmt.Sprintf("cus_kill_%04d", i),
			currency: currencies[i%len(currencies)], amount: int64(1000 + 7*i)}
		c.body = fmt.Sprintf(`{"customer_id":%q,"amount_cents":%d,"currency":%q,"card_token":"tok_visa","items":[{"sku":"sku-%d","qty":%d}]}`,
			c.customer, c.amount, c.currency, i, 1+i%5)
		out[i] = c
	}
	return out
}

// killThresholds returns when to kill, in answered checkouts: one moment
// drawn in each of kills equal stretches of the middle of the load.
func killThresholds(rnd *faults.Source, n, kills int) []int {
	lo, hi := n/10, 8*n/10
	width := max((hi-lo)/kills, 1)
	out := make([]int, kills)
	for i := range out {
		out[i] = lo + i*width + rnd.IntN(width)
	}
	return out
}

type killResult struct {
	answer answer
	err    error
}

// killClient is an HTTP client for probes of one server's answer, with no
// retry.
func killClient(clients int) *http.Client {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = clients
	return &http.Client{Transport: transport, Timeout: time.Minute}
}

// killPause waits d unless ctx ends first; it reports whether it waited.
func killPause(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// killUntil polls cond until it holds or the clients have all ended, and
// fails the test when ctx ends first.
func killUntil(t *testing.T, ctx context.Context, ended <-chan struct{}, cond func() bool, what string) {
	t.Helper()
	ticker := time.NewTicker(2 * time.Millisecond)
	defer ticker.Stop()
	for !cond() {
		select {
		case <-ticker.C:
		case <-ended:
			return
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s: %v", what, ctx.Err())
		}
	}
}

func killConnect(t *testing.T, e *env) *pgx.Conn {
	t.Helper()
	// Straight to PostgreSQL, past any PgBouncer: killSettle tells its own
	// server session from the others.
	conn, err := pgx.Connect(e.ctx, dbtest.DirectURL(t, e.dbURL))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// killNow is the database's clock.
func killNow(t *testing.T, conn *pgx.Conn) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now))
	return now
}

// killAwaitWork waits, for a few seconds at most, until the running server
// (started at since) holds a checkout in flight with its first phase
// committed, so that the kill that follows interrupts one. It stops early
// when the load is over, and returns how many it saw.
func killAwaitWork(t *testing.T, ctx context.Context, conn *pgx.Conn, since time.Time, over func() bool) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM onceflow_keys
			WHERE status = 'in_flight' AND locked_until > clock_timestamp() AND updated_at >= $1`, since).Scan(&n))
		if n > 0 || over() || time.Now().After(deadline) {
			return n
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// killSettle waits until no other session of the database has a
// transaction or a statement under way: what the killed server sent before
// it died has committed or rolled back, so the records it left in flight
// stay so until a new server takes them over.
func killSettle(t *testing.T, ctx context.Context, conn *pgx.Conn) {
	t.Helper()
	killPoll(t, time.Minute, 5*time.Millisecond, "the killed server's sessions end", func() bool {
		var busy int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()
			  AND (xact_start IS NOT NULL OR state IS DISTINCT FROM 'idle')`).Scan(&busy))
		return busy == 0
	})
}

// killPoll checks cond every so often, on the test's goroutine, until it
// holds; it fails the test after timeout.
func killPoll(t *testing.T, timeout, every time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %s waiting until %s", timeout, what)
		}
		time.Sleep(every)
	}
}

// killOwned is a key record as one attempt owned it.
type killOwned struct {
	key   string
	id    uuid.UUID
	owner uuid.UUID
}

// killFrozen returns the records in flight that were not in flight under the
// same owner at an earlier kill, and adds them to seen.
func killFrozen(t *testing.T, conn *pgx.Conn, seen map[killOwned]bool) []killOwned {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT key, id, owner FROM onceflow_keys WHERE status = 'in_flight'`)
	require.NoError(t, err)
	var (
		newly []killOwned
		o     killOwned
	)
	_, err = pgx.ForEachRow(rows, []any{&o.key, &o.id, &o.owner}, func() error {
		if !seen[o] {
			seen[o] = true
			newly = append(newly, o)
		}
		return nil
	})
	require.NoError(t, err)
	return newly
}

// killChargedAlready counts the records whose charge the provider made
// although the record does not say so yet.
func killChargedAlready(charges []Charge, records []killOwned) int {
	made := map[string]bool{}
	for _, c := range charges {
		made[c.IdempotencyKey] = true
	}
	n := 0
	for _, r := range records {
		if made[killChargeKey(r.key, r.id)] {
			n++
		}
	}
	return n
}

// killChargeKey is the downstream key of a record's charge step.
func killChargeKey(key string, id uuid.UUID) string {
	return foreign.DeriveKey(recovery.Key{Tenant: "acme", ID: key}, id, "charge")
}

// killPaid is a checkout's 201 body.
type killPaid struct {
	OrderID     string `json:"order_id"`
	ChargeID    string `json:"charge_id"`
	Status      string `json:"status"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// killCheckAnswers checks that every answer is its own key's paid order,
// and no two keys share an order or a charge.
func killCheckAnswers(t *testing.T, checkouts []killCheckout, answers map[string]answer) {
	t.Helper()
	orders, charges := map[string]string{}, map[string]string{}
	for _, c := range checkouts {
		var paid killPaid
		require.NoError(t, json.Unmarshal(answers[c.key].body, &paid), "key %s", c.key)
		require.Equal(t, killPaid{OrderID: paid.OrderID, ChargeID: paid.ChargeID, Status: "paid", AmountCents: c.amount, Currency: c.currency},
			paid, "key %s", c.key)
		require.NotEmpty(t, paid.OrderID, "key %s", c.key)
		require.NotEmpty(t, paid.ChargeID, "key %s", c.key)
		require.NotContains(t, orders, paid.OrderID, "keys %s and %s got one order", orders[paid.OrderID], c.key)
		require.NotContains(t, charges, paid.ChargeID, "keys %s and %s got one charge", charges[paid.ChargeID], c.key)
		orders[paid.OrderID], charges[paid.ChargeID] = c.key, c.key
	}
}

// killRecord is a key record joined with the order its state names.
type killRecord struct {
	id                                       uuid.UUID
	status                                   string
	attempts, responseStatus                 int
	responseBody                             []byte
	stateOrder                               string
	orderID, customer, currency, orderStatus string
	chargeID                                 string
	amount                                   int64
}

func killRecords(t *testing.T, conn *pgx.Conn) map[string]killRecord {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		SELECT k.key, k.id, k.status, k.attempts, coalesce(k.response_status, 0), coalesce(k.response_body, ''),
		       coalesce(k.state->>'order_id', ''), coalesce(o.id, ''), coalesce(o.customer_id, ''), coalesce(o.amount_cents, 0),
		       coalesce(o.currency, ''), coalesce(o.status, ''), coalesce(o.charge_id, '')
		FROM onceflow_keys k
		LEFT JOIN checkout_orders o ON o.id = k.state->>'order_id' AND o.tenant_id = k.tenant_id
		WHERE k.tenant_id = 'acme'`)
	require.NoError(t, err)
	records := map[string]killRecord{}
	var (
		key string
		r   killRecord
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &r.id, &r.status, &r.attempts, &r.responseStatus, &r.responseBody,
		&r.stateOrder, &r.orderID, &r.customer, &r.amount, &r.currency, &r.orderStatus, &r.chargeID}, func() error {
		r.responseBody = bytes.Clone(r.responseBody)
		records[key] = r
		return nil
	})
	require.NoError(t, err)
	return records
}

// killCheckStorage checks the database: one completed record per key,
// storing the answer its client got, naming one paid order of the key's own
// customer and amount, with one receipt queued; no other order. It returns
// how many records were taken over at least once.
func killCheckStorage(t *testing.T, conn *pgx.Conn, checkouts []killCheckout, answers map[string]answer, records map[string]killRecord) int {
	t.Helper()
	require.Len(t, records, len(checkouts), "one key record per key")
	takenOver := 0
	for _, c := range checkouts {
		r, ok := records[c.key]
		require.True(t, ok, "key %s has no record", c.key)
		var paid killPaid
		require.NoError(t, json.Unmarshal(answers[c.key].body, &paid))
		require.Equal(t, "completed", r.status, "key %s", c.key)
		require.Equal(t, http.StatusCreated, r.responseStatus, "key %s", c.key)
		require.Equal(t, string(answers[c.key].body), string(r.responseBody), "key %s: the stored response is the answer", c.key)
		require.Equal(t, paid.OrderID, r.stateOrder, "key %s", c.key)
		require.Equal(t, paid.OrderID, r.orderID, "key %s: its order exists", c.key)
		require.Equal(t, []any{c.customer, c.amount, c.currency, "paid", paid.ChargeID},
			[]any{r.customer, r.amount, r.currency, r.orderStatus, r.chargeID}, "key %s: its order", c.key)
		if r.attempts > 0 {
			takenOver++
		}
	}
	var orders, customers, receipts int
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT customer_id) FROM checkout_orders`).Scan(&orders, &customers))
	require.Equal(t, len(checkouts), orders, "one order per key, and no order left over")
	require.Equal(t, len(checkouts), customers, "one order per key, and no order left over")
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT count(*) FROM onceflow_outbox WHERE topic = 'receipt'`).Scan(&receipts))
	require.Equal(t, len(checkouts), receipts, "every paid order queued its receipt with its completion")
	return takenOver
}

// killCheckCharges checks the provider: one charge per key, made with the
// key's own downstream key, for the key's amount, and named by its order.
func killCheckCharges(t *testing.T, charges []Charge, checkouts []killCheckout, answers map[string]answer, records map[string]killRecord) {
	t.Helper()
	require.Equal(t, len(checkouts), len(charges), "one charge per key")
	byKey := map[string]Charge{}
	for _, ch := range charges {
		require.NotContains(t, byKey, ch.IdempotencyKey, "two charges share a downstream key: %+v", ch)
		byKey[ch.IdempotencyKey] = ch
	}
	for _, c := range checkouts {
		ch, ok := byKey[killChargeKey(c.key, records[c.key].id)]
		require.True(t, ok, "key %s: no charge with its downstream key", c.key)
		var paid killPaid
		require.NoError(t, json.Unmarshal(answers[c.key].body, &paid))
		require.Equal(t, paid.ChargeID, ch.ID, "key %s: the answer names the charge made for it", c.key)
		require.Equal(t, []any{c.amount, c.currency}, []any{ch.AmountCents, ch.Currency}, "key %s: the charge", c.key)
	}
}

// TestPausedOwnerIsFencedOut freezes a checkout server right after the
// provider answered its charge (the provider made the charge): the server
// stops itself there with SIGSTOP (--stop-after charge), between two steps,
// with no transaction, call or lease renewal of its attempt under way. The
// key's lease ends, and a second server takes the key over, charges (the
// provider deduplicates) and stops itself at the same point. Then the first
// server gets SIGCONT and goes on with its stale checkout: it runs its last
// phase (the order marked paid, the receipt queued), and the fenced write
// that would commit it fails and rolls it all back, however long either
// freeze lasted. It proves that an attempt that stalled past its lease
// cannot change anything once another owns the key, even while that owner
// has not finished: its client gets a 409 that names no order, and the
// order, the stored response and the provider's single charge are those the
// second owner makes once it wakes.
func TestPausedOwnerIsFencedOut(t *testing.T) {
	// A 1s lease runs out on its own by the database clock.
	t.Run("lease runs out", func(t *testing.T) { killPausedOwner(t, false) })
	// A 30s lease, ended by hand (recovery.Store.ExpireLease).
	t.Run("lease ended by hand", func(t *testing.T) { killPausedOwner(t, true) })
}

func killPausedOwner(t *testing.T, endByHand bool) {
	e := newEnv(t)
	proxy := killNewProxy(t, e.provider, 0) // records each charge's downstream key
	lease := "1s"
	if endByHand {
		lease = "30s"
	}
	paused := e.serve("--provider-url", proxy.url, "--lease", lease, "--sweep-every", "1h", "--stop-after", "charge")
	t.Cleanup(func() { _ = paused.Proc.Signal(syscall.SIGCONT) }) // before it is stopped
	// The second server's lease outlasts the test: it renews nothing while
	// the rows are compared.
	next := e.serve("--provider-url", proxy.url, "--lease", "5m", "--sweep-every", "1h", "--stop-after", "charge")
	t.Cleanup(func() { _ = next.Proc.Signal(syscall.SIGCONT) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client := killClient(2)
	const key = "paused"
	k := recovery.Key{Tenant: "acme", ID: key}
	store, err := recovery.New(dbtest.Connect(t, e.dbURL, 2), recovery.Config{})
	require.NoError(t, err)
	conn := killConnect(t, e)

	first := killPostAsync(ctx, client, paused.URL, key)
	killAwaitStop(t, paused, first)
	stoppedAt := time.Now()
	charges := e.charges()
	require.Len(t, charges, 1)
	rec, err := store.Load(ctx, k)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusInFlight, rec.Status)
	require.Equal(t, "create_order", rec.RecoveryPoint, "stopped between the order and the record of its charge")
	require.Equal(t, killChargeKey(key, rec.ID), charges[0].IdempotencyKey)

	if endByHand {
		require.NoError(t, store.ExpireLease(ctx, k))
	}
	// A stopped server renews nothing: its lease ends within the lease.
	killPoll(t, time.Minute, 20*time.Millisecond, "the stopped server's lease ends", func() bool {
		var over bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT locked_until < clock_timestamp() FROM onceflow_keys
			WHERE tenant_id = 'acme' AND key = $1`, key).Scan(&over))
		return over
	})
	second := killPostAsync(ctx, client, next.URL, key)
	killAwaitStop(t, next, second)
	taken, err := store.Load(ctx, k)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusInFlight, taken.Status)
	require.Equal(t, "create_order", taken.RecoveryPoint)
	require.NotEqual(t, rec.Owner, taken.Owner, "the takeover has an owner token of its own")
	require.Equal(t, 1, taken.Attempts, "the stopped attempt is counted")
	require.Equal(t, charges, e.charges(), "the second owner's charge is the first one's, deduplicated")
	before := killSnapshot(t, conn)

	// The first server wakes while the key's new owner is mid-checkout.
	require.NoError(t, paused.Proc.Signal(syscall.SIGCONT))
	frozenFor := time.Since(stoppedAt)
	woke := killAwaitAnswer(t, ctx, first, "the woken server answers its client")
	require.Equal(t, http.StatusConflict, woke.status, "the woken attempt lost the key: %s", woke.body)
	require.NotContains(t, string(woke.body), "order_id")
	require.NotContains(t, string(woke.body), "charge_id")
	// The log line was written before the answer, but reaches us through a
	// pipe of its own.
	killPoll(t, time.Minute, 10*time.Millisecond, "the woken server logs its lost lease", func() bool {
		return strings.Contains(paused.Stderr(), "lease lost; this attempt's uncommitted writes rolled back")
	})
	logged := paused.Stderr()
	// Its commit found the key taken over, or, should the phase have
	// outlasted a third of the lease, its heartbeat's renewal did: both are
	// fenced writes.
	require.Regexp(t, `lease lost; this attempt's uncommitted writes rolled back.* step=record_charge`, logged,
		"the last phase ran and its fenced write failed")
	require.Equal(t, before, killSnapshot(t, conn), "the woken attempt changed no row")
	require.Equal(t, 0, e.count(`SELECT count(*) FROM checkout_orders WHERE status <> 'pending'`), "its order update rolled back")
	require.Equal(t, 0, e.count(`SELECT count(*) FROM onceflow_outbox`), "its receipt rolled back")

	require.NoError(t, next.Proc.Signal(syscall.SIGCONT))
	done := killAwaitAnswer(t, ctx, second, "the second server finishes the checkout")
	require.Equal(t, http.StatusCreated, done.status, done.body)
	var paid killPaid
	require.NoError(t, json.Unmarshal(done.body, &paid))
	require.Equal(t, charges[0].ID, paid.ChargeID, "the second owner's charge is the first one's, deduplicated")
	rec, err = store.Load(ctx, k)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusCompleted, rec.Status)
	require.Equal(t, taken.Owner, rec.Owner)
	require.Equal(t, string(done.body), string(rec.Response.Body), "the stored response is the second owner's")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM checkout_orders WHERE status = 'paid' AND charge_id = $1`, paid.ChargeID))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM checkout_orders`))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM onceflow_outbox`))
	require.Equal(t, charges, e.charges(), "no second charge")
	require.Equal(t, []string{charges[0].IdempotencyKey, charges[0].IdempotencyKey}, proxy.chargeKeys(),
		"both attempts asked for the charge, with one downstream key")
	for _, app := range []*serveProcess{paused, next} {
		again, err := post(ctx, client, app.URL, key, order)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, again.status)
		require.Equal(t, string(done.body), string(again.body), "the second owner's answer stands")
		require.Equal(t, "true", again.replayed)
	}
	t.Logf("stopped for %s; the woken attempt answered %d and logged: %s", frozenFor.Round(time.Millisecond),
		woke.status, killLines(logged, "lease lost"))
}

// killAwaitStop waits until app has stopped itself (--stop-after) while
// answering results, and it has logged so.
func killAwaitStop(t *testing.T, app *serveProcess, results <-chan killResult) {
	t.Helper()
	killPoll(t, time.Minute, 5*time.Millisecond, "the server stops itself after the charge", func() bool {
		select {
		case r := <-results:
			t.Fatalf("the checkout ended before its server stopped: %v %d %s", r.err, r.answer.status, r.answer.body)
		default:
		}
		return killStopped(t, app.Proc.Pid())
	})
	// The log line reaches us through a pipe of its own.
	killPoll(t, time.Minute, 10*time.Millisecond, "the server logs where it stopped", func() bool {
		return strings.Contains(app.Stderr(), "stopping after charge's call, as asked")
	})
}

// killPostAsync posts the checkout order under key and delivers the result.
func killPostAsync(ctx context.Context, client *http.Client, base, key string) <-chan killResult {
	out := make(chan killResult, 1)
	go func() {
		a, err := post(ctx, client, base, key, order)
		out <- killResult{a, err}
	}()
	return out
}

func killAwaitAnswer(t *testing.T, ctx context.Context, results <-chan killResult, what string) answer {
	t.Helper()
	select {
	case r := <-results:
		require.NoError(t, r.err, what)
		return r.answer
	case <-ctx.Done():
		t.Fatalf("gave up waiting until %s", what)
	}
	return answer{}
}

// killProxy stands between the checkout servers and the provider. The
// first charge requests wait at a gate each until it is released, and so
// does the next one after holdNext; every request's downstream key is
// recorded.
type killProxy struct {
	url      string
	upstream string
	gates    []*killGate
	mu       sync.Mutex
	keys     []string
	next     *killGate // holds the next charge request, when not nil
	armed    []*killGate
}

// killGate holds one charge request.
type killGate struct {
	arrived chan struct{} // closed when the request arrived
	open    chan struct{} // closed to let it through
	once    sync.Once
}

func (g *killGate) release() { g.once.Do(func() { close(g.open) }) }

func killNewProxy(t *testing.T, upstream string, held int) *killProxy {
	p := &killProxy{upstream: upstream}
	for range held {
		p.gates = append(p.gates, &killGate{arrived: make(chan struct{}), open: make(chan struct{})})
	}
	srv := httptest.NewServer(http.HandlerFunc(p.charge))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { // before srv.Close, which waits for held requests
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, g := range append(p.gates, p.armed...) {
			g.release()
		}
	})
	p.url = srv.URL
	return p
}

// holdNext holds the next charge request at a new gate, and returns it.
func (p *killProxy) holdNext() *killGate {
	g := &killGate{arrived: make(chan struct{}), open: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next = g
	p.armed = append(p.armed, g)
	return g
}

func (p *killProxy) chargeKeys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.keys...)
}

func (p *killProxy) charge(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/charges" {
		http.NotFound(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	p.mu.Lock()
	p.keys = append(p.keys, strings.Trim(r.Header.Get(foreign.Header), `"`))
	var g *killGate
	if n := len(p.keys); n <= len(p.gates) {
		g = p.gates[n-1]
	} else {
		g, p.next = p.next, nil
	}
	p.mu.Unlock()
	if g != nil {
		close(g.arrived)
		select {
		case <-g.open:
		case <-r.Context().Done():
			return
		}
	}
	req, err := http.NewRequestWithContext(context.WithoutCancel(r.Context()), http.MethodPost, p.upstream+"/charges", bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	req.Header.Set("Content-Type", r.Header.Get("Content-Type"))
	req.Header.Set(foreign.Header, r.Header.Get(foreign.Header))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
}

// killStopped reports whether the process is stopped by a signal.
func killStopped(t *testing.T, pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	// "pid (comm) state ...": comm may hold spaces and parentheses.
	rest := stat[bytes.LastIndexByte(stat, ')')+1:]
	fields := strings.Fields(string(rest))
	return len(fields) > 0 && (fields[0] == "T" || fields[0] == "t")
}

// killSnapshot is every row of the checkout's and onceflow's tables, each
// with the transaction that wrote it last.
func killSnapshot(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var s string
	require.NoError(t, conn.QueryRow(context.Background(), `
		SELECT coalesce(string_agg(r, E'\n' ORDER BY r), '') FROM (
		    SELECT 'key ' || k.xmin::text || ' ' || row_to_json(k)::text AS r FROM onceflow_keys k
		    UNION ALL SELECT 'order ' || o.xmin::text || ' ' || row_to_json(o)::text FROM checkout_orders o
		    UNION ALL SELECT 'receipt ' || c.xmin::text || ' ' || row_to_json(c)::text FROM checkout_receipts c
		    UNION ALL SELECT 'outbox ' || m.xmin::text || ' ' || row_to_json(m)::text FROM onceflow_outbox m
		) rows`).Scan(&s))
	require.Contains(t, s, "order ")
	return s
}

// killLines returns the lines of log that contain s.
func killLines(log, s string) string {
	var out []string
	for line := range strings.Lines(log) {
		if strings.Contains(line, s) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return strings.Join(out, "; ")
}
