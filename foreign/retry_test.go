package foreign_test

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var (
	acme  = workflow.Key{Tenant: "acme", ID: "order-1"}
	order = testapp.Order{Customer: "c-1", Amount: 1999, Card: "tok_visa"}
)

// shop is one test's database, fake provider and engine running the
// shared checkout, whose charge step has the test's options.
type shop struct {
	t        *testing.T
	ctx      context.Context
	db       *pgxpool.Pool
	provider *testapp.Provider
	engine   *workflow.Engine
	checkout *workflow.Workflow[testapp.Order, testapp.State]
	waits    *waits
	seen     *seen
}

// newShop starts a shop whose engine has cfg (Observer and Logger are the
// shop's) and whose charge step has opts, its waits between tries
// recorded instead of waited.
func newShop(t *testing.T, cfg workflow.Config, opts ...foreign.Option) *shop {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	db := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{}), 8)
	_, err := db.Exec(ctx, testapp.Schema)
	require.NoError(t, err)
	s := &shop{t: t, ctx: ctx, db: db, provider: testapp.NewProvider(t), waits: &waits{}, seen: &seen{}}
	cfg.Observer, cfg.Logger = s.seen, slog.New(s.seen)
	s.engine, err = workflow.NewEngine(db, cfg)
	require.NoError(t, err)
	opts = append(opts, foreign.WithSleep(s.waits.sleep))
	s.checkout = testapp.Checkout(s.provider.URL, testapp.Options{Charge: opts})
	return s
}

// chargeKey is the key the charge step derives for acme's record.
func (s *shop) chargeKey() string {
	s.t.Helper()
	var id uuid.UUID
	require.NoError(s.t, s.db.QueryRow(s.ctx, `SELECT id FROM onceflow_keys WHERE tenant_id = $1 AND key = $2`,
		acme.Tenant, acme.ID).Scan(&id))
	return foreign.DeriveKey(acme, id, "charge")
}

// waits records the waits between tries and returns at once.
type waits struct {
	mu   sync.Mutex
	list []time.Duration
}

func (w *waits) sleep(ctx context.Context, d time.Duration) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, d)
	return ctx.Err()
}

func (w *waits) all() []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]time.Duration(nil), w.list...)
}

// seen is an Observer and a log handler: it keeps the retries the engine
// reports, the steps' errors, and the retry log lines.
type seen struct {
	mu       sync.Mutex
	retries  map[string]int   // workflow + " " + step
	stepErrs map[string]error // step -> its last error
	logged   []slog.Record    // retry lines
}

func (s *seen) Claimed(string, string) {}
func (s *seen) LeaseLost(string)       {}
func (s *seen) Parked(string)          {}
func (s *seen) StepFinished(_, step string, _ time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stepErrs == nil {
		s.stepErrs = map[string]error{}
	}
	s.stepErrs[step] = err
}
func (s *seen) StepRetried(workflow, step string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.retries == nil {
		s.retries = map[string]int{}
	}
	s.retries[workflow+" "+step]++
}
func (*seen) PaceWaited(string, time.Duration)    {}
func (*seen) PaceDeferred(string)                 {}
func (*seen) CircuitOpened(string, time.Duration) {}

func (s *seen) Enabled(context.Context, slog.Level) bool { return true }
func (s *seen) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s *seen) WithGroup(string) slog.Handler            { return s }
func (s *seen) Handle(_ context.Context, r slog.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Message == "foreign call failed; retrying within the attempt" {
		s.logged = append(s.logged, r)
	}
	return nil
}

func (s *seen) retried(workflow, step string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.retries[workflow+" "+step]
}

func (s *seen) stepErr(step string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stepErrs[step]
}

func (s *seen) lines() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, r := range s.logged {
		attrs := map[string]any{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.Any(); return true })
		out = append(out, attrs)
	}
	return out
}

func status(code int) testapp.Fault { return testapp.Fault{Status: code} }

func retryAfter(code int, value string) testapp.Fault {
	return testapp.Fault{Status: code, Header: http.Header{"Retry-After": {value}}}
}

// A provider that fails twice and then answers is charged once: the
// three tries of one attempt send one derived key, the engine logs and
// counts each retry, and the workflow completes. (Mutations caught: one
// try whatever Max says; a key derived per try; the engine not wiring
// Retried.)
func TestRetryTransientThenSuccess(t *testing.T) {
	s := newShop(t, workflow.Config{}, foreign.Retry{Max: 3, Base: time.Millisecond})
	s.provider.Fail("charges", status(503), status(502))

	res, err := s.checkout.Run(s.ctx, s.engine, acme, order)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	require.JSONEq(t, `{"order_id":1,"charge_id":"ch_1","status":"paid"}`, string(res.Response.Body))

	key := s.chargeKey()
	require.Equal(t, []string{key, key, key}, s.provider.Keys("charges"), "every try sends the step's derived key")
	require.Equal(t, 1, s.provider.Effects("charges"))
	require.Equal(t, []time.Duration{time.Millisecond, 2 * time.Millisecond}, s.waits.all())
	require.Equal(t, 2, s.seen.retried("checkout", "charge"))
	lines := s.seen.lines()
	require.Len(t, lines, 2)
	require.Equal(t, "charge", lines[0]["step"])
	require.Equal(t, int64(1), lines[0]["try"])
	require.Equal(t, 2*time.Millisecond, lines[1]["wait"])
	require.Contains(t, lines[1]["error"].(error).Error(), "502")

	rec, err := s.engine.Store().Load(s.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusCompleted, rec.Status)
	require.Zero(t, rec.Attempts, "the retries were within the first attempt, which did not fail")
}

// A refusal (400) is not retried: one call, no wait, the step's error is
// permanent, and the engine fails the workflow at once. (Mutation caught:
// retrying a Permanent error.)
func TestRetryPermanentIsNotRetried(t *testing.T) {
	s := newShop(t, workflow.Config{}, foreign.Retry{Max: 5, Base: time.Millisecond})
	s.provider.Fail("charges", status(400))

	res, err := s.checkout.Run(s.ctx, s.engine, acme, order)
	require.NoError(t, err)
	require.True(t, res.Failed, "a permanent error fails the workflow terminally, on its first attempt")
	require.Len(t, s.provider.Keys("charges"), 1)
	require.Empty(t, s.waits.all())
	require.Zero(t, s.seen.retried("checkout", "charge"))
	stepErr := s.seen.stepErr("charge")
	require.True(t, phase.IsPermanent(stepErr), "%v", stepErr)
	var h *foreign.HTTPError
	require.ErrorAs(t, stepErr, &h)
	require.Equal(t, 400, h.Status)
}

// A call whose answer never comes is cut by the per-try timeout, and the
// next try, with the same key, gets the effect the hung call made. The
// run's own deadline is ten timeouts: without the per-try timeout the
// hung call holds the step until then and the run fails. (Mutation
// caught: the timeout not applied to a try.)
func TestRetryTimeoutCutsAHungTry(t *testing.T) {
	const perTry = time.Second
	s := newShop(t, workflow.Config{}, foreign.Retry{Max: 2, Base: time.Millisecond}, foreign.Timeout(perTry))
	s.provider.Fail("charges", testapp.Fault{Hang: true})

	ctx, cancel := context.WithTimeout(s.ctx, 10*perTry)
	defer cancel()
	res, err := s.checkout.Run(ctx, s.engine, acme, order)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	key := s.chargeKey()
	require.Equal(t, []string{key, key}, s.provider.Keys("charges"))
	require.Equal(t, 1, s.provider.Effects("charges"), "the hung call's effect, answered to the second try")
	require.Len(t, s.waits.all(), 1)
}

// Each Retry-After is honoured, in seconds and as a date (taken from the
// answer's Date, not the local clock), and a wait of exactly a third of
// the lease is still waited. (Mutations caught: the backoff used instead
// of a longer Retry-After; the date read against the local clock;
// deferring at a third of the lease rather than beyond it.)
func TestRetryHonoursRetryAfter(t *testing.T) {
	s := newShop(t, workflow.Config{}, foreign.Retry{Max: 4, Base: time.Millisecond})
	third := recovery.LeaseDefault / 3
	sent := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC) // the provider's clock, years off this one
	s.provider.Fail("charges",
		retryAfter(429, "2"),
		testapp.Fault{Status: 503, Header: http.Header{
			"Date":        {sent.Format(http.TimeFormat)},
			"Retry-After": {sent.Add(3 * time.Second).Format(http.TimeFormat)}}},
		retryAfter(503, "10"),
	)
	require.Equal(t, 10*time.Second, third, "the last fault asks for exactly a third of the lease")

	res, err := s.checkout.Run(s.ctx, s.engine, acme, order)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	require.Equal(t, []time.Duration{2 * time.Second, 3 * time.Second, third}, s.waits.all())
	require.Len(t, s.provider.Keys("charges"), 4)
	require.Equal(t, 1, s.provider.Effects("charges"))
}

// A Retry-After longer than a third of the lease is not waited with the
// key held: the step returns a phase.DeferError for that long, after one
// call, and the engine hands the key back until then. (Mutations caught:
// no deferral; deferring beyond the lease rather than a third of it.)
func TestRetryAfterBeyondAThirdOfTheLeaseDefers(t *testing.T) {
	const lease = 30 * time.Second
	s := newShop(t, workflow.Config{Lease: lease}, foreign.Retry{Max: 3, Base: time.Millisecond})
	s.provider.Fail("charges", retryAfter(429, "11"), retryAfter(429, "11"))

	_, err := s.checkout.Run(s.ctx, s.engine, acme, order)
	require.Error(t, err)
	var deferred *phase.DeferError
	require.ErrorAs(t, s.seen.stepErr("charge"), &deferred)
	require.Equal(t, lease/3+time.Second, deferred.After)
	var h *foreign.HTTPError
	require.ErrorAs(t, deferred.Err, &h)
	require.Equal(t, 429, h.Status)
	require.Len(t, s.provider.Keys("charges"), 1)
	require.Empty(t, s.waits.all())
	require.Zero(t, s.seen.retried("checkout", "charge"))

	// The engine handed the key back until then: a retry now runs nothing.
	_, err = s.checkout.Run(s.ctx, s.engine, acme, order)
	var inFlight *recovery.InFlightError
	require.ErrorAs(t, err, &inFlight)
	require.True(t, inFlight.Deferred)
	require.Len(t, s.provider.Keys("charges"), 1)
}

// Max bounds the tries of an attempt, and the waits between them double
// from Base up to Cap; after the last try its error is the step's.
// (Mutations caught: one try too many; the cap not applied.)
func TestRetryMaxBoundsTheTries(t *testing.T) {
	s := newShop(t, workflow.Config{}, foreign.Retry{Max: 5, Base: time.Millisecond, Cap: 3 * time.Millisecond})
	s.provider.Fail("charges", status(500), status(500), status(500), status(500), status(500), status(500))

	_, err := s.checkout.Run(s.ctx, s.engine, acme, order)
	require.Error(t, err)
	require.Len(t, s.provider.Keys("charges"), 5)
	require.Zero(t, s.provider.Effects("charges"))
	ms := time.Millisecond
	require.Equal(t, []time.Duration{ms, 2 * ms, 3 * ms, 3 * ms}, s.waits.all())
	var h *foreign.HTTPError
	require.ErrorAs(t, s.seen.stepErr("charge"), &h)
	require.Equal(t, 500, h.Status)
	require.False(t, phase.IsPermanent(s.seen.stepErr("charge")))

	rec, err := s.engine.Store().Load(s.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, 1, rec.Attempts, "the spent tries are one failed attempt")
}

// A workflow outcome from a foreign step is an answer: it is stored after
// one call, not retried. (Mutation caught: retrying an outcome.)
func TestRetryDoesNotRetryAnOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{}), 4)
	engine, err := workflow.NewEngine(db, workflow.Config{})
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		calls int
	)
	wf := workflow.Define("pay",
		foreign.Mutation("charge", func(context.Context, *foreign.Call[testapp.Order, testapp.State]) error {
			mu.Lock()
			defer mu.Unlock()
			calls++
			return workflow.Respond(workflow.Problem(402, "card declined"))
		}, foreign.Retry{Max: 3, Base: time.Millisecond}),
	)
	res, err := wf.Run(ctx, engine, acme, order)
	require.NoError(t, err)
	require.Equal(t, 402, res.Response.Status)
	require.Equal(t, 1, calls)
}
