package idemhttp_test

import (
	"context"
	"errors"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

type Payment struct {
	AmountCents int64 `json:"amount_cents"`
}

func (p Payment) Validate() error {
	if p.AmountCents <= 0 {
		return errors.New("amount_cents must be positive")
	}
	return nil
}

type Paid struct {
	Row    int64  `json:"row"`
	Charge string `json:"charge"`
}

type workflowServer struct {
	*server
	failCharge  atomic.Int32 // the charge fails this many more times
	deferCharge atomic.Int64 // when set, the next charge defers for this long (a time.Duration)
	block       chan gate
}

// gate holds a charge: it closes entered, then waits for release.
type gate struct{ entered, release chan struct{} }

func newWorkflowServer(t *testing.T) *workflowServer {
	t.Helper()
	return newWorkflowServerWith(t, idemhttp.WorkflowConfig{Tenant: trustedTenant})
}

// newWorkflowServerWith is newWorkflowServer with the handler configured by
// cfg.
func newWorkflowServerWith(t *testing.T, cfg idemhttp.WorkflowConfig) *workflowServer {
	t.Helper()
	return newWorkflowServerOn(t, cfg, workflow.Config{})
}

// newWorkflowServerOn is newWorkflowServerWith with an engine configured
// by engineCfg.
func newWorkflowServerOn(t *testing.T, cfg idemhttp.WorkflowConfig, engineCfg workflow.Config) *workflowServer {
	t.Helper()
	t.Parallel()
	return newWorkflowServerOnPool(t, dbtest.NewPool(t, 16), cfg, engineCfg)
}

// newWorkflowServerOnPool is newWorkflowServerOn on pool.
func newWorkflowServerOnPool(t *testing.T, pool *pgxpool.Pool, cfg idemhttp.WorkflowConfig, engineCfg workflow.Config) *workflowServer {
	t.Helper()
	s := &workflowServer{server: &server{t: t, db: pool}, block: make(chan gate, 1)}
	_, err := s.db.Exec(context.Background(), `CREATE TABLE payments (id bigserial PRIMARY KEY, charge text)`)
	require.NoError(t, err)
	wf := workflow.Define("pay",
		phase.Atomic("insert", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Payment, Paid]) error {
			return tx.QueryRow(ctx, `INSERT INTO payments DEFAULT VALUES RETURNING id`).Scan(&r.State.Row)
		}),
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[Payment, Paid]) error {
			s.runs.Add(1)
			select {
			case g := <-s.block:
				close(g.entered)
				<-g.release
			default:
			}
			if s.failCharge.Add(-1) >= 0 {
				return errors.New("provider timeout")
			}
			if after := time.Duration(s.deferCharge.Swap(0)); after != 0 {
				return phase.Defer(after, errors.New("provider answered 429"))
			}
			c.State.Charge = c.Key[:12]
			return nil
		}),
		phase.Atomic("record", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Payment, Paid]) error {
			_, err := tx.Exec(ctx, `UPDATE payments SET charge = $2 WHERE id = $1`, r.State.Row, r.State.Charge)
			return err
		}),
	).Finish(func(s *Paid) workflow.Response { return workflow.JSON(http.StatusCreated, s) })
	engine, err := workflow.NewEngine(s.db, engineCfg)
	require.NoError(t, err)
	h, err := idemhttp.Workflow(engine, wf, cfg)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func TestWorkflowHandler(t *testing.T) {
	s := newWorkflowServer(t)
	first := s.post("/v1/charges", "k1", "acme", `{"amount_cents": 500}`)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	require.Contains(t, first.body, `"charge":"of1_`)
	again := s.post("/v1/charges", "k1", "acme", `{"amount_cents":5e2}`)
	require.Equal(t, first.body, again.body)
	require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader))
	require.EqualValues(t, 1, s.runs.Load())

	mismatch := s.post("/v1/charges", "k1", "acme", `{"amount_cents": 501}`)
	require.Equal(t, http.StatusUnprocessableEntity, mismatch.status)
}

func TestWorkflowHandlerRejectsBadBodiesWithoutARecord(t *testing.T) {
	s := newWorkflowServer(t)
	for body, status := range map[string]int{
		`{"amount_cents": 0}`:             http.StatusUnprocessableEntity, // Validate
		`{"amount_cents": 1, "extra": 1}`: http.StatusBadRequest,          // unknown field
		`{"amount_cents": "1"}`:           http.StatusBadRequest,
		`{"amount_cents": 1} {}`:          http.StatusBadRequest,
		`not json`:                        http.StatusBadRequest,
	} {
		r := s.post("/v1/charges", "k1", "acme", body)
		require.Equal(t, status, r.status, body)
		problemOf(t, r)
	}
	require.Zero(t, s.runs.Load())
	var keys int
	require.NoError(t, s.db.QueryRow(context.Background(), `SELECT count(*) FROM onceflow_keys`).Scan(&keys))
	require.Zero(t, keys)
}

func TestWorkflowHandlerFailureThenResume(t *testing.T) {
	s := newWorkflowServer(t)
	s.failCharge.Store(1)
	failed := s.post("/v1/charges", "k1", "acme", `{"amount_cents": 500}`)
	require.Equal(t, http.StatusInternalServerError, failed.status)
	require.Contains(t, problemOf(t, failed), "retry with the same key to resume")
	ok := s.post("/v1/charges", "k1", "acme", `{"amount_cents": 500}`)
	require.Equal(t, http.StatusCreated, ok.status)
	var rows int
	require.NoError(t, s.db.QueryRow(context.Background(), `SELECT count(*) FROM payments`).Scan(&rows))
	require.Equal(t, 1, rows, "the retry resumed after insert")
}

func TestWorkflowHandlerInFlight(t *testing.T) {
	s := newWorkflowServer(t)
	g := gate{entered: make(chan struct{}), release: make(chan struct{})}
	s.block <- g
	done := make(chan reply, 1)
	go func() { done <- s.post("/v1/charges", "k1", "acme", `{"amount_cents": 500}`) }()
	<-g.entered // the first request is in its charge, its first phase committed
	r := s.post("/v1/charges", "k1", "acme", `{"amount_cents": 500}`)
	require.Equal(t, http.StatusConflict, r.status)
	require.NotEmpty(t, r.header.Get("Retry-After"))
	close(g.release)
	require.Equal(t, http.StatusCreated, (<-done).status)
}

// TestWorkflowHandlerDeferredKey: a charge that defers answers 503 with
// Retry-After: the deferral; a retry before it is over gets 409 with
// Retry-After: the time left (the deferral, less at most the time since it
// was made) and runs nothing; once it is over, a retry finishes the work.
func TestWorkflowHandlerDeferredKey(t *testing.T) {
	s := newWorkflowServer(t)
	const after = 120 * time.Second
	s.deferCharge.Store(int64(after))
	start := time.Now()
	first := s.post("/v1/charges", "k1", "acme", `{"amount_cents": 500}`)
	require.Equal(t, http.StatusServiceUnavailable, first.status, first.body)
	require.Equal(t, "120", first.header.Get("Retry-After"))
	require.Contains(t, problemOf(t, first), "retry with the same key after Retry-After")

	retry := s.post("/v1/charges", "k1", "acme", `{"amount_cents": 500}`)
	elapsed := time.Since(start)
	require.Equal(t, http.StatusConflict, retry.status, retry.body)
	seconds, err := strconv.Atoi(retry.header.Get("Retry-After"))
	require.NoError(t, err)
	// Retry-After is the time left rounded up to a second.
	require.LessOrEqual(t, seconds, int(after/time.Second))
	require.GreaterOrEqual(t, float64(seconds), (after - elapsed).Seconds())
	require.Contains(t, problemOf(t, retry), "waits for another system")
	require.EqualValues(t, 1, s.runs.Load(), "the retry ran nothing")

	_, err = s.db.Exec(context.Background(), `UPDATE onceflow_keys SET not_before = clock_timestamp() - interval '1 millisecond'`)
	require.NoError(t, err)
	done := s.post("/v1/charges", "k1", "acme", `{"amount_cents": 500}`)
	require.Equal(t, http.StatusCreated, done.status, done.body)
	require.EqualValues(t, 2, s.runs.Load())
}

func TestWorkflowHandlerNeedsKeyAndTenant(t *testing.T) {
	s := newWorkflowServer(t)
	require.Equal(t, 400, s.post("/v1/charges", "", "acme", `{"amount_cents": 1}`).status)
	require.Equal(t, 401, s.post("/v1/charges", "k", "", `{"amount_cents": 1}`).status)
	req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/charges", strings.NewReader(`{"amount_cents": 1}`))
	req.Header.Set("Idempotency-Key", "k")
	req.Header.Add("Idempotency-Key", "k2")
	req.Header.Set("X-Tenant-ID", "acme")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 400, resp.StatusCode, string(body))
}

// TestWorkflowConfigIsChecked: Workflow refuses a config without a tenant
// or with a negative bound before it registers anything.
func TestWorkflowConfigIsChecked(t *testing.T) {
	t.Parallel()
	engine, err := workflow.NewEngine(nil, workflow.Config{})
	require.NoError(t, err)
	wf := workflow.Define("config-checked", phase.Atomic("only", func(context.Context, pgx.Tx, *phase.Run[Payment, Paid]) error {
		return nil
	})).Finish(func(s *Paid) workflow.Response { return workflow.JSON(http.StatusCreated, s) })
	_, err = idemhttp.Workflow(engine, wf, idemhttp.WorkflowConfig{})
	require.ErrorIs(t, err, idemhttp.ErrNoTenant, "the tenant has no default")
	_, err = idemhttp.Workflow(engine, wf, idemhttp.WorkflowConfig{Tenant: trustedTenant, BodyTimeout: -1})
	require.ErrorIs(t, err, recovery.ErrInvalidInput)
	require.Empty(t, engine.Workflows(), "nothing was registered")
}

// Transfer is a request of an integer that may have more than 21 digits.
type Transfer struct {
	Amount *big.Int `json:"amount"`
}

// TestWorkflowHandlerTakesAndResumesHugeIntegers: a body with a 31-digit
// amount is a request like any other (a *big.Int does not read the
// canonical form's exponent), and once its client is gone, Resume (the
// completer's path) finishes it from the stored request with that amount.
func TestWorkflowHandlerTakesAndResumesHugeIntegers(t *testing.T) {
	t.Parallel()
	s := &server{t: t, db: dbtest.NewPool(t, 16)}
	var (
		mu      sync.Mutex
		amounts []string // each call's amount
		failed  bool
	)
	wf := workflow.Define("transfer",
		foreign.Mutation("send", func(_ context.Context, c *foreign.Call[Transfer, Paid]) error {
			mu.Lock()
			defer mu.Unlock()
			amounts = append(amounts, c.Request.Amount.String())
			if !failed {
				failed = true
				return errors.New("provider timeout")
			}
			return nil
		}),
		phase.Atomic("record", func(context.Context, pgx.Tx, *phase.Run[Transfer, Paid]) error { return nil }),
	)
	engine, err := workflow.NewEngine(s.db, workflow.Config{})
	require.NoError(t, err)
	h, err := idemhttp.Workflow(engine, wf, idemhttp.WorkflowConfig{Tenant: trustedTenant})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s.url = srv.URL

	const amount = "1000000000000000000000000000001"
	first := s.post("/", "k1", "acme", `{"amount": `+amount+`}`)
	require.Equal(t, http.StatusInternalServerError, first.status, first.body)
	res, err := engine.Resume(context.Background(), workflow.Key{Tenant: "acme", ID: "k1"})
	require.NoError(t, err)
	require.False(t, res.Failed)
	mu.Lock()
	require.Equal(t, []string{amount, amount}, amounts)
	mu.Unlock()

	again := s.post("/", "k1", "acme", `{ "amount" : `+amount+` }`)
	require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader), "%d %s", again.status, again.body)
	// A spelling the type cannot read is refused, as it always was.
	exponent := s.post("/", "k2", "acme", `{"amount": 1.000000000000000000000000000001e30}`)
	require.Equal(t, http.StatusBadRequest, exponent.status)
}
