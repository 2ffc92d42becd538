package foreign_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/pgbouncer"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// fleet is one database, one fake provider, and several engines on pools
// of their own, as separate processes would be, all pacing "payments".
type fleet struct {
	t        *testing.T
	ctx      context.Context
	url      string
	provider *testapp.Provider
	pools    []*pgxpool.Pool
	engines  []*workflow.Engine
	checkout *workflow.Workflow[testapp.Order, testapp.State]
	seen     *paceSeen
}

// newFleet starts n engines whose Config is cfg with the fleet's Observer,
// on the database at url ("" for a new one), running the checkout with its
// charge under foreign.Limit("payments") and opts.
func newFleet(t *testing.T, url string, n int, cfg workflow.Config, opts ...foreign.Option) *fleet {
	t.Helper()
	ctx := context.Background()
	if url == "" {
		url = dbtest.NewDatabase(t, dbtest.Options{})
	}
	f := &fleet{t: t, ctx: ctx, url: url, provider: testapp.NewProvider(t), seen: &paceSeen{}}
	cfg.Observer = f.seen
	for i := range n {
		pool := dbtest.Connect(t, url, 4)
		if i == 0 {
			_, err := pool.Exec(ctx, testapp.Schema)
			require.NoError(t, err)
		}
		e, err := workflow.NewEngine(pool, cfg)
		require.NoError(t, err)
		f.pools, f.engines = append(f.pools, pool), append(f.engines, e)
	}
	f.checkout = testapp.Checkout(f.provider.URL, testapp.Options{Charge: append(opts, foreign.Limit("payments"))})
	return f
}

// runAll runs perEngine checkouts on every engine at once, each under a
// key of its own, and returns their errors.
func (f *fleet) runAll(perEngine int) []error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for i, e := range f.engines {
		for j := range perEngine {
			wg.Go(func() {
				key := workflow.Key{Tenant: "acme", ID: fmt.Sprintf("order-%d-%d", i, j)}
				res, err := f.checkout.Run(f.ctx, e, key, order)
				if err == nil && res.Response.Status != 201 {
					err = fmt.Errorf("%s answered %d", key.ID, res.Response.Status)
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return errs
}

// paceSeen is an Observer that keeps what the pacing reports.
type paceSeen struct {
	workflow.NopObserver
	mu       sync.Mutex
	waits    int
	deferred int
	opened   chan time.Duration
}

func (s *paceSeen) PaceWaited(string, time.Duration) { s.mu.Lock(); s.waits++; s.mu.Unlock() }
func (s *paceSeen) PaceDeferred(string)              { s.mu.Lock(); s.deferred++; s.mu.Unlock() }
func (s *paceSeen) CircuitOpened(_ string, open time.Duration) {
	s.mu.Lock()
	ch := s.opened
	s.mu.Unlock()
	if ch != nil {
		ch <- open
	}
}

// nextOpened waits for the next circuit opened, at most ten seconds.
func (s *paceSeen) nextOpened(t *testing.T) time.Duration {
	t.Helper()
	select {
	case open := <-s.opened:
		return open
	case <-time.After(10 * time.Second):
		t.Fatal("no circuit was opened")
		return 0
	}
}

func (s *paceSeen) counts() (waits, deferred int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waits, s.deferred
}

// Three engines on pools of their own call a provider whose calls take a
// while, eight checkouts each at once: the provider never serves more calls
// at once than the Pace's Concurrency, and each checkout charges once.
// (Mutations caught: a claim that ignores held_until; Pace skipping the
// slot.)
func TestPaceConcurrencyAcrossEngines(t *testing.T) {
	t.Parallel()
	const concurrency = 2
	f := newFleet(t, "", 3, workflow.Config{Pacing: map[string]foreign.Pace{"payments": {Concurrency: concurrency}}})
	f.provider.SetLatency(20 * time.Millisecond)

	require.Empty(t, f.runAll(8))
	require.Equal(t, 24, f.provider.Effects("charges"))
	require.Equal(t, 1, f.provider.MaxCalls("charges"), "one call per key")
	require.LessOrEqual(t, f.provider.MaxConcurrent(), concurrency)
	waits, _ := f.seen.counts()
	require.Positive(t, waits, "24 calls for 2 slots: some waited, and the engine counted them")
	var held int
	require.NoError(t, f.pools[0].QueryRow(f.ctx, `SELECT count(*) FROM onceflow_pace_slots WHERE holder IS NOT NULL`).Scan(&held))
	require.Zero(t, held, "every slot was given back")
}

// Three engines call at once through a Pace of Rate 20 per second, Burst 1,
// Concurrency 3: in any window of a second the provider sees at most
// Burst + Rate·1s + Concurrency calls start (a call reserved before the
// window and delayed into it holds a slot), and the forty calls take at
// least (40 - Burst - Concurrency) / Rate between the first and the last
// arrival. Both bounds come from the Pace, whatever the machine's speed.
// (Mutations caught: a bucket that does not take the token; a refill that
// ignores the elapsed time's units.)
func TestPaceRateAcrossEngines(t *testing.T) {
	t.Parallel()
	const (
		rate, burst, concurrency = 20, 1, 3
		calls                    = 40
	)
	f := newFleet(t, "", 4, workflow.Config{Pacing: map[string]foreign.Pace{
		"payments": {Concurrency: concurrency, Rate: rate, Burst: burst}}})

	require.Empty(t, f.runAll(calls/4))
	require.Equal(t, calls, f.provider.Effects("charges"))
	require.LessOrEqual(t, f.provider.MaxIn(time.Second), burst+rate+concurrency)
	at := f.provider.Arrivals()
	span := at[len(at)-1].Sub(at[0])
	least := time.Duration(float64(calls-burst-concurrency) / rate * float64(time.Second))
	require.GreaterOrEqual(t, span, least, "forty calls at %d per second", rate)
}

// A 429 with Retry-After opens the downstream's circuit: a second key,
// started once it is open, does not call the provider before it closes
// (by the database clock, which the provider's shares on this machine),
// and the first key's retry waits it out too. (Mutation caught: an answer
// that opens no circuit.)
func TestPaceCircuitHoldsOtherKeysBack(t *testing.T) {
	t.Parallel()
	f := newFleet(t, "", 2, workflow.Config{Pacing: map[string]foreign.Pace{"payments": {}}},
		foreign.Retry{Max: 2, Base: time.Millisecond})
	f.seen.opened = make(chan time.Duration, 1)
	f.provider.Fail("charges", retryAfter(429, "1"))

	first := make(chan error, 1)
	go func() {
		_, err := f.checkout.Run(f.ctx, f.engines[0], workflow.Key{Tenant: "acme", ID: "first"}, order)
		first <- err
	}()
	require.Equal(t, time.Second, f.seen.nextOpened(t))
	var openUntil time.Time
	require.NoError(t, f.pools[1].QueryRow(f.ctx, `SELECT open_until FROM onceflow_pace WHERE downstream = 'payments'`).Scan(&openUntil))
	res, err := f.checkout.Run(f.ctx, f.engines[1], workflow.Key{Tenant: "acme", ID: "second"}, order)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	require.NoError(t, <-first)

	at := f.provider.Arrivals()
	require.Len(t, at, 3, "the 429, the first key's retry, the second key's call")
	for _, a := range at[1:] {
		require.False(t, a.Before(openUntil), "a call at %s, before the circuit closed at %s", a, openUntil)
	}
}

// A circuit open longer than a third of the lease defers a key that meets
// it, calling nothing: its error says why. (Mutation caught: the circuit
// waited out whatever its length.)
func TestPaceCircuitDefersALongWait(t *testing.T) {
	t.Parallel()
	f := newFleet(t, "", 1, workflow.Config{Lease: 3 * time.Second, Pacing: map[string]foreign.Pace{"payments": {}}})
	f.seen.opened = make(chan time.Duration, 1)
	f.provider.Fail("charges", retryAfter(429, "60"))

	_, err := f.checkout.Run(f.ctx, f.engines[0], workflow.Key{Tenant: "acme", ID: "first"}, order)
	var deferred *phase.DeferError
	require.ErrorAs(t, err, &deferred, "the 429's own Retry-After defers its key")
	require.Equal(t, time.Minute, f.seen.nextOpened(t))

	_, err = f.checkout.Run(f.ctx, f.engines[0], workflow.Key{Tenant: "acme", ID: "second"}, order)
	var wait *foreign.WaitError
	require.ErrorAs(t, err, &wait)
	require.True(t, wait.Circuit)
	require.Greater(t, wait.Wait, time.Second)
	require.Len(t, f.provider.Arrivals(), 1, "the second key called nothing")
	_, deferrals := f.seen.counts()
	require.Equal(t, 1, deferrals)
}

// A step under a Limit the engine has no Pace for fails with
// ErrUnknownDownstream, calls nothing and is not retried; a Pace out of
// range is refused when the engine is made. (Mutation caught: the error
// retried within the attempt.)
func TestPaceUnknownDownstreamAndBadPace(t *testing.T) {
	s := newShop(t, workflow.Config{}, foreign.Limit("payments"), foreign.Retry{Max: 3})
	_, err := s.checkout.Run(s.ctx, s.engine, acme, order)
	require.ErrorIs(t, err, foreign.ErrUnknownDownstream)
	require.Empty(t, s.provider.Arrivals())
	require.Empty(t, s.waits.all(), "no retry: no try can change the engine's configuration")

	for _, p := range []foreign.Pace{{Concurrency: -1}, {Rate: -1}, {Burst: 2}, {Concurrency: foreign.PaceConcurrencyLimit + 1}} {
		_, err := workflow.NewEngine(s.db, workflow.Config{Pacing: map[string]foreign.Pace{"payments": p}})
		require.ErrorIs(t, err, foreign.ErrInvalidPace, "%+v", p)
		require.ErrorIs(t, err, workflow.ErrInvalidInput, "%+v", p)
	}
	_, err = workflow.NewEngine(s.db, workflow.Config{Pacing: map[string]foreign.Pace{"": {}}})
	require.ErrorIs(t, err, foreign.ErrInvalidPace)
	require.Panics(t, func() { foreign.Limit("") })
}

// pacer returns a Pacer of limits on a pool of its own of the database at
// url.
func pacer(t *testing.T, url string, limits map[string]foreign.Pace) (*foreign.Pacer, *pgxpool.Pool) {
	t.Helper()
	pool := dbtest.Connect(t, url, 2)
	p, err := foreign.NewPacer(pool, foreign.PacerConfig{Limits: limits})
	require.NoError(t, err)
	return p, pool
}

// blocked runs a call through p that holds its slot until release is
// closed or its context ends, and returns once the call has started, with
// a channel of its error.
func blocked(ctx context.Context, p *foreign.Pacer, lease time.Duration, release <-chan struct{}) <-chan error {
	started, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- p.Pace(ctx, "payments", "acme", lease, func(ctx context.Context) error {
			close(started)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		})
	}()
	select {
	case <-started:
	case err := <-done:
		done <- err
	}
	return done
}

// A call waiting for a slot holds no connection and no transaction while
// it waits: at every wait, its pool has none acquired and the server has
// no session idle in a transaction. (Mutation caught: a claim made in a
// transaction held across the wait.)
func TestPaceWaitHoldsNoConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	limits := map[string]foreign.Pace{"payments": {Concurrency: 1}}
	holder, _ := pacer(t, url, limits)
	waiter, waiterPool := pacer(t, url, limits)
	admin := dbtest.Connect(t, dbtest.DirectURL(t, url), 1)

	release := make(chan struct{})
	held := blocked(ctx, holder, time.Minute, release)
	waits := 0
	foreign.SetPacerSleep(waiter, func(ctx context.Context, d time.Duration) error {
		waits++
		require.Zero(t, waiterPool.Stat().AcquiredConns(), "a connection held during a wait")
		var inTx int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state LIKE 'idle in transaction%'`).Scan(&inTx))
		require.Zero(t, inTx, "a transaction open during a wait")
		if waits == 3 {
			close(release)
		}
		return foreign.Sleep(ctx, d)
	})
	require.NoError(t, waiter.Pace(ctx, "payments", "acme", time.Minute, func(context.Context) error { return nil }))
	require.NoError(t, <-held)
	require.GreaterOrEqual(t, waits, 3)
}

// The slot of a holder that died (its pool closed: no renewal, no release)
// frees when its lease ends, not before: another process's call gets it
// after held_until by the database clock. (Mutations caught: a claim that
// ignores held_until; a slot held for ever.)
func TestPaceSlotOfACrashedHolderFrees(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	limits := map[string]foreign.Pace{"payments": {Concurrency: 1}}
	holder, holderPool := pacer(t, url, limits)
	waiter, waiterPool := pacer(t, url, limits)

	const lease = time.Second
	holderCtx, crash := context.WithCancel(ctx)
	defer crash()
	held := blocked(holderCtx, holder, lease, nil)
	holderPool.Close() // the process is gone: its slot is neither renewed nor given back
	var heldUntil time.Time
	require.NoError(t, waiterPool.QueryRow(ctx, `SELECT held_until FROM onceflow_pace_slots WHERE holder IS NOT NULL`).Scan(&heldUntil))

	var gotAt time.Time
	require.NoError(t, waiter.Pace(ctx, "payments", "acme", time.Minute, func(ctx context.Context) error {
		return waiterPool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&gotAt)
	}))
	require.False(t, gotAt.Before(heldUntil), "the slot was taken at %s, before its lease ended at %s", gotAt, heldUntil)
	require.Error(t, <-held, "the dead holder's call was cancelled once its slot could no longer be renewed")
}

// A limit lowered below the slots an earlier, higher one made leaves the
// extra slots unusable: with slot 0 held, a Pace of Concurrency 1 waits
// (here: defers, its lease being short) although slots 1 and 2 are free.
// (Mutation caught: a claim that does not stop at the limit.)
func TestPaceLoweredLimitLeavesNoExtraSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	wide, _ := pacer(t, url, map[string]foreign.Pace{"payments": {Concurrency: 3}})
	narrow, _ := pacer(t, url, map[string]foreign.Pace{"payments": {Concurrency: 1}})

	release := make(chan struct{})
	held := blocked(ctx, wide, time.Minute, release)
	called := false
	err := narrow.Pace(ctx, "payments", "acme", 300*time.Millisecond, func(context.Context) error { called = true; return nil })
	var wait *foreign.WaitError
	require.ErrorAs(t, err, &wait)
	require.False(t, wait.Circuit)
	require.False(t, called)
	close(release)
	require.NoError(t, <-held)
	require.NoError(t, narrow.Pace(ctx, "payments", "acme", time.Minute, func(context.Context) error { called = true; return nil }))
	require.True(t, called)
}

// Behind PgBouncer in transaction pooling mode, with two server
// connections for three engines, pacing holds: every statement is a
// transaction of its own, with nothing kept in a session.
func TestPaceThroughPgBouncer(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	if dbtest.PgBouncer() == nil {
		b, err := pgbouncer.Start(context.Background(), pgbouncer.Options{Server: url, PoolSize: 2})
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Stop() })
		cfg, err := pgconn.ParseConfig(url)
		require.NoError(t, err)
		url = b.URL(cfg.Database)
	}
	const concurrency = 2
	f := newFleet(t, url, 3, workflow.Config{Pacing: map[string]foreign.Pace{
		"payments": {Concurrency: concurrency, Rate: 100, Burst: 5}}})
	f.provider.SetLatency(10 * time.Millisecond)

	require.Empty(t, f.runAll(6))
	require.Equal(t, 18, f.provider.Effects("charges"))
	require.LessOrEqual(t, f.provider.MaxConcurrent(), concurrency)
}

// A Pace per tenant limits each tenant apart: with tenant acme's one slot
// held, another tenant's call goes through at once, and acme's next one
// waits its turn (here: defers, its lease being short). (Mutation caught:
// the tenant ignored, so every tenant shares one slot.)
func TestPacePerTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	p, _ := pacer(t, url, map[string]foreign.Pace{"payments": {Concurrency: 1, PerTenant: true}})

	release := make(chan struct{})
	held := blocked(ctx, p, time.Minute, release) // tenant acme
	require.NoError(t, p.Pace(ctx, "payments", "globex", 300*time.Millisecond, func(context.Context) error { return nil }))
	err := p.Pace(ctx, "payments", "acme", 300*time.Millisecond, func(context.Context) error { return nil })
	var wait *foreign.WaitError
	require.ErrorAs(t, err, &wait)
	require.Equal(t, "acme", wait.Tenant)
	close(release)
	require.NoError(t, <-held)
}
