package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/lease"
	"github.com/onceflow/onceflow/internal/opentx"
	"github.com/onceflow/onceflow/internal/poolgate"
	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/internal/tracing"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// ErrNoTransaction reports Tx called outside a handler that Middleware
// wraps.
var ErrNoTransaction = errors.New("idemhttp: no transaction: the handler is not behind idemhttp.Middleware")

// cleanupTimeout bounds the writes made after a handler failed.
const cleanupTimeout = 10 * time.Second

// Middleware returns middleware that makes handlers idempotent under the
// Idempotency-Key header, storing keys in db (a *pgxpool.Pool).
//
// The first request with a key claims it and runs the handler; its response
// is stored (status, allow-listed headers, body) and every retry by the
// same tenant and principal gets it again, with Idempotent-Replayed: true,
// without running the handler. A replay skips the handler and whatever
// checks it makes: put the middleware after your authentication, and say
// in cfg.Tenant and cfg.Principal what it established. The handler may
// make its writes in the transaction that stores the response (Tx). A
// response that cfg.Store refuses (by default 401, 403, 407, 408, 425, 429
// and 5xx), one over cfg.MaxResponse, or a panic, is not stored: the
// transaction rolls back, the claim is dropped, and a retry runs the
// handler again. A handler whose only effects are its writes through Tx
// may set cfg.Atomic: the claim then opens that transaction, and the
// request commits once.
//
// Migrate db first (`onceflow migrate up`, or migrations.Migrator.Up, with
// the schema of cfg.Schema): until then every request with a key is
// answered 503 without running the handler, and the first one logs an
// error that names the schema and the command.
//
// It returns ErrNoTenant when cfg.Tenant is nil.
func Middleware(db workflow.DB, cfg Config) (func(http.Handler) http.Handler, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	store, err := recovery.New(db, recovery.Config{Schema: cfg.Schema, ResponseHeaders: cfg.ResponseHeaders, Lease: cfg.Lease,
		IdleTimeout: cfg.IdleTimeout})
	if err != nil {
		return nil, err
	}
	c := newCore(cfg.shared())
	c.operation, c.dbTimeout, c.optional, c.observer = cfg.Operation, cfg.DBTimeout, cfg.KeyOptional, cfg.Observer
	m := &middleware{core: c, db: db, store: store, stores: cfg.Store, maxResponse: cfg.MaxResponse, atomic: cfg.Atomic}
	if cfg.Atomic {
		m.gate = poolgate.For(db)
	}
	return func(next http.Handler) http.Handler {
		h := *m
		h.next = next
		return &h
	}, nil
}

type middleware struct {
	*core
	db          workflow.DB
	store       *recovery.Store
	stores      func(status int) bool
	maxResponse int64
	atomic      bool // Config.Atomic: the claim opens the handler's transaction
	// gate keeps the pool's last connection from Atomic requests, which
	// hold one through their handler, for a handler that takes another.
	gate poolgate.Gate
	next http.Handler
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	who, p := m.identify(r)
	if p != nil && p.noKey && m.optional {
		m.unprotected(w, r)
		return
	}
	if p != nil {
		writeProblem(w, p)
		return
	}
	body, p := m.readBody(w, r)
	if p != nil {
		writeProblem(w, p)
		return
	}
	op := m.operation(r)
	// The record keeps the trace context of the request that creates it,
	// so that every later request's trace can be tied to it; the handler
	// runs in it too.
	r = r.WithContext(tracing.Extract(r))
	traceParent := tracing.TraceParent(trace.SpanContextFromContext(r.Context()))
	var (
		rec     *recovery.Record
		outcome recovery.Outcome
		sent    time.Time
		open    *opened // Atomic: the transaction the claim opened
		params  = recovery.ClaimParams{Key: who.key, Workflow: op,
			Fingerprint: fingerprint(op, r, body), Principal: who.principal, TraceParent: traceParent}
	)
	claim := func() (err error) {
		claimCtx, cancel := context.WithTimeout(r.Context(), m.dbTimeout)
		defer cancel()
		if m.atomic {
			sent = time.Now() // before the claim reads the record, as lease.Send's is
			rec, outcome, open, err = m.claimOpening(claimCtx, params)
		} else {
			sent, err = lease.Send(claimCtx, m.db, func(conn *pgxpool.Conn) (err error) {
				rec, outcome, err = seam.StoreOf(m.store).WithConn(conn).Claim(claimCtx, params)
				return err
			})
		}
		m.observe(op, outcome, err)
		m.resetIfReadOnly(r, err)
		return err
	}
	err := m.waits.await(w, r, claim(), claim)
	if errors.Is(err, recovery.ErrInFlight) {
		m.expires(w, time.Time{})
	}
	if err != nil {
		writeProblem(w, m.claimProblem(r, err))
		return
	}
	if outcome == recovery.OutcomeReplay {
		// The completion on this process's clock: sent was taken before
		// the database read its clock for FinishedFor.
		m.expires(w, sent.Add(-rec.FinishedFor))
		writeResponse(w, *rec.Response, true)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	m.serve(w, r, rec, sent, open)
}

// beginSQL opens the handler's transaction, with its first statement or
// with an Atomic claim: READ COMMITTED, whatever the server's default, so
// that the completion that commits with it sees the lease renewals made
// while the handler ran, which a REPEATABLE READ snapshot taken before
// them would refuse with a serialization failure.
const beginSQL = "begin isolation level read committed"

// opened is the transaction an Atomic claim opened: its connection, and
// the mark it carries (opentx).
type opened struct {
	conn *pgxpool.Conn
	mark string
}

// claimOpening claims p for an Atomic handler: BEGIN, the transaction's
// mark and the claim in one round trip, on a connection it returns with
// the transaction open when the request is to run. A new record is not
// inserted yet (migration 0019): the response inserts it. For any other
// answer (a replay, a key in flight) the transaction, which wrote nothing,
// is rolled back off the caller's path.
func (m *middleware) claimOpening(ctx context.Context, p recovery.ClaimParams) (*recovery.Record, recovery.Outcome, *opened, error) {
	if err := m.gate.Enter(ctx); err != nil {
		return nil, 0, nil, fmt.Errorf("%w: %w", recovery.ErrUnavailable, err)
	}
	conn, err := m.db.Acquire(ctx)
	if err != nil {
		m.gate.Leave()
		return nil, 0, nil, fmt.Errorf("%w: %w", recovery.ErrUnavailable, err)
	}
	mark := opentx.NewMark()
	rec, outcome, err := seam.StoreOf(m.store).BeginAndClaim(ctx, conn, []string{beginSQL}, mark, p)
	if err != nil || outcome == recovery.OutcomeReplay {
		go m.rollBack(conn)
		return rec, outcome, nil, err
	}
	return rec, outcome, &opened{conn: conn, mark: mark}, nil
}

// rollBack ends the transaction of conn, an Atomic claim's connection,
// without committing, releases conn and gives its place at the gate back.
func (m *middleware) rollBack(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	_, _ = conn.Exec(ctx, "rollback")
	conn.Release()
	m.gate.Leave()
}

// serve runs the handler for a claimed key, keeping its lease meanwhile
// (the claim was sent at sent), and stores its response. The handler's
// context ends when the lease is lost or may have ended. With open, the
// transaction an Atomic claim opened, the handler's Tx is that
// transaction, and no lease is kept: until it ends, the key's lock keeps
// every other claim out.
func (m *middleware) serve(w http.ResponseWriter, r *http.Request, rec *recovery.Record, sent time.Time, open *opened) {
	var out *recorder
	var t *txHolder
	var outcome handlerOutcome
	if open != nil {
		out, t, outcome = m.handle(w, r, open)
	} else {
		fence := rec.Fence()
		keeper := lease.New(m.store.Lease(), sent,
			func(ctx context.Context) (time.Time, error) { return m.store.Renew(ctx, fence, 0) }, nil)
		ctx, stop := keeper.Hold(r.Context())
		out, t, outcome = m.handle(w, r.WithContext(ctx), nil)
		if lost := stop(); lost != nil {
			m.logger.WarnContext(r.Context(), "the handler ran past its lease", slog.String("operation", rec.Workflow), slog.Any("error", lost))
		}
	}
	// What is left to do is done even if the client went away: the work is.
	cleanupCtx, cancelCleanup := context.WithTimeout(context.WithoutCancel(r.Context()), cleanupTimeout)
	defer cancelCleanup()
	resp := out.response()
	aborted := outcome == returned && t.aborted()
	if outcome != returned || out.over || !m.stores(resp.Status) || aborted {
		_ = t.end(cleanupCtx, nil) // rolls back, an Atomic claim with it; another claim is forgotten next
		if open == nil {
			m.forget(cleanupCtx, rec)
		}
		if aborted && m.stores(resp.Status) && !out.over {
			m.logger.ErrorContext(r.Context(), "a statement failed in the handler's transaction, so its answer cannot be stored with its writes; "+
				"run a statement whose error the handler answers in a savepoint (Tx's Begin)",
				slog.String("operation", rec.Workflow), slog.Int("status", resp.Status))
			writeProblem(w, &problem{status: http.StatusInternalServerError,
				detail: "the request failed: a statement in its transaction failed; it may be retried"})
			return
		}
		m.answerUnstored(w, r, out, outcome)
		return
	}
	completing := time.Now() // no later than the completion the statement stamps
	err := t.end(cleanupCtx, func(conn *pgxpool.Conn, mark string) error {
		if conn == nil {
			return m.store.Complete(cleanupCtx, rec.Fence(), resp)
		}
		return seam.StoreOf(m.store).CompleteAndCommit(cleanupCtx, conn, mark, rec.Fence(), "", nil, resp)
	})
	switch {
	case errors.Is(err, opentx.ErrEnded):
		m.failEnded(cleanupCtx, w, r, rec, err)
	case errors.Is(err, recovery.ErrLeaseLost):
		m.expires(w, time.Time{})
		writeProblem(w, &problem{status: http.StatusConflict, retryAfter: time.Second,
			detail: "another attempt took this request over; retry to get its answer"})
	case err != nil:
		m.logger.ErrorContext(r.Context(), "could not store the response", slog.Any("error", err))
		m.resetIfReadOnly(r, err)
		if open == nil {
			m.forget(cleanupCtx, rec) // nothing was stored: let a retry run it again
		}
		writeProblem(w, &problem{status: http.StatusServiceUnavailable, retryAfter: time.Second,
			detail: "the response could not be stored; retry with the same key"})
	default:
		m.expires(w, completing)
		writeResponse(w, resp, false)
	}
}

// failEnded fails the record of a request whose handler ended or
// restarted its transaction (a COMMIT in a string of statements, COMMIT
// AND CHAIN), found by the commit's check of the transaction's mark
// (cause): the handler's writes may be committed without the response, and
// running it again could make them twice. The failure is stored, so every
// retry gets the same 500 and nothing runs again.
func (m *middleware) failEnded(ctx context.Context, w http.ResponseWriter, r *http.Request, rec *recovery.Record, cause error) {
	m.logger.ErrorContext(r.Context(), "the handler ended or restarted its transaction; the request failed for good so that its writes are not made again",
		slog.String("operation", rec.Workflow), slog.Any("error", cause))
	resp := workflow.Problem(http.StatusInternalServerError, "the request failed and will not be retried: its handler ended its own transaction")
	if err := m.store.Fail(ctx, rec.Fence(), resp, cause.Error()); err != nil {
		m.logger.ErrorContext(r.Context(), "could not store the failure", slog.Any("error", err))
	}
	m.expires(w, time.Time{})
	writeResponse(w, resp, false)
}

// resetIfReadOnly resets the middleware's pool when err is a write a
// read-only server refused (recovery.ResetIfReadOnly): a failover left
// the pool's connections on a standby, and the request is answered 503.
func (m *middleware) resetIfReadOnly(r *http.Request, err error) {
	if recovery.ResetIfReadOnly(m.db, err) {
		m.logger.WarnContext(r.Context(), "the database refused a write as read-only (a standby, after a failover?); the pool's connections were closed", slog.Any("error", err))
	}
}

// answerUnstored answers a claimed request whose response is not stored:
// as the handler answered, unless it panicked or its response went over
// MaxResponse while its transaction was open (then 500: its writes rolled
// back). A response already streamed is left as sent.
func (m *middleware) answerUnstored(w http.ResponseWriter, r *http.Request, out *recorder, outcome handlerOutcome) {
	if out.over {
		m.logger.WarnContext(r.Context(), "the response is larger than MaxResponse; it was not stored",
			slog.String("operation", m.operation(r)), slog.Int64("max_response", m.maxResponse), slog.Bool("sent", out.streamed))
	}
	switch {
	case outcome == aborted || outcome == panicked && out.streamed:
		panic(http.ErrAbortHandler)
	case outcome == panicked:
		writeProblem(w, &problem{status: http.StatusInternalServerError, detail: "the request failed; it may be retried"})
	case out.streamed:
	case out.over:
		writeProblem(w, &problem{status: http.StatusInternalServerError,
			detail: "the response was too large to keep, so the request's writes were rolled back; it may be retried"})
	default:
		writeResponse(w, out.response(), false)
	}
}

// unprotected runs the handler for a request without a key, on a route
// that allows it: nothing is claimed or stored, but Tx works the same, and
// its transaction commits unless the handler answers 500 or more (or its
// response went over MaxResponse while it was open).
func (m *middleware) unprotected(w http.ResponseWriter, r *http.Request) {
	body, p := m.readBody(w, r)
	if p != nil {
		writeProblem(w, p)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	out, t, outcome := m.handle(w, r, nil)
	resp := out.response()
	commit := func(conn *pgxpool.Conn, _ string) error {
		if conn == nil {
			return nil
		}
		_, err := conn.Exec(r.Context(), "commit")
		return err
	}
	if outcome != returned || out.over || resp.Status >= 500 {
		commit = nil
	}
	err := t.end(r.Context(), commit)
	switch {
	case outcome != returned || out.over:
		m.answerUnstored(w, r, out, outcome)
	case err != nil:
		writeProblem(w, &problem{status: http.StatusServiceUnavailable, detail: "the request's writes could not be committed"})
	default:
		writeResponse(w, resp, false)
	}
}

// handlerOutcome is how a handler ended.
type handlerOutcome int

const (
	returned handlerOutcome = iota
	panicked
	aborted // panic(http.ErrAbortHandler): the connection is to be dropped
)

// handle runs the handler with a transaction to lend (Tx) and a recorder
// in front of w, and returns the recorder, the transaction holder and how
// the handler ended. The transaction is the one open, if set; else it
// begins on first use.
func (m *middleware) handle(w http.ResponseWriter, r *http.Request, open *opened) (*recorder, *txHolder, handlerOutcome) {
	t := &txHolder{db: m.db, timeout: m.dbTimeout}
	if open != nil {
		t.conn, t.tx, t.gate = open.conn, opentx.New(open.conn.Conn(), "", open.mark), m.gate
	}
	r = r.WithContext(context.WithValue(r.Context(), txKey{}, t))
	out := &recorder{header: http.Header{}, limit: m.maxResponse, w: w, tx: t}
	outcome := m.run(out, r)
	return out, t, outcome
}

// run calls the handler and reports how it ended.
func (m *middleware) run(w http.ResponseWriter, r *http.Request) (outcome handlerOutcome) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				outcome = aborted
				return
			}
			m.logger.ErrorContext(r.Context(), "handler panicked", slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
			outcome = panicked
		}
	}()
	m.next.ServeHTTP(w, r)
	return returned
}

// forget drops the claim of a request whose response is not stored, so
// that a retry runs the handler afresh.
func (m *middleware) forget(ctx context.Context, rec *recovery.Record) {
	if err := m.store.DeleteUnstarted(ctx, rec.Fence()); err != nil {
		m.logger.WarnContext(ctx, "could not drop the claim of a failed request", slog.Any("error", err))
	}
}

type txKey struct{}

// errTxDone reports Tx called after the handler returned.
var errTxDone = errors.New("idemhttp: the request's transaction is over: Tx was called after the handler returned")

// errTxStreamed reports Tx called after the response went over
// MaxResponse and was sent on without being stored.
var errTxStreamed = errors.New("idemhttp: no transaction: the response is larger than MaxResponse and was sent without being stored")

// errResponseTooLarge is what a handler's Write returns once its response
// went over MaxResponse while its transaction was open.
var errResponseTooLarge = errors.New("idemhttp: the response is larger than MaxResponse: it will not be sent, and the transaction rolls back")

// txHolder begins the handler's transaction on first use, on a connection
// it holds until the response is stored, and refuses to begin one after.
// An Atomic claim's transaction is open in it from the start.
type txHolder struct {
	mu      sync.Mutex
	db      workflow.DB
	timeout time.Duration // bounds taking a connection and beginning
	conn    *pgxpool.Conn
	tx      *opentx.Tx
	lent    bool  // the handler got the transaction
	closed  error // why no transaction may begin any more; nil while one may
	// gate is the place an Atomic claim's connection holds, given back
	// with the connection; nil for a transaction begun on first use.
	gate poolgate.Gate
}

// get returns the transaction, beginning it on first use.
func (t *txHolder) get(ctx context.Context) (pgx.Tx, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed != nil {
		return nil, t.closed
	}
	if t.tx == nil {
		acquireCtx, cancel := context.WithTimeout(ctx, t.timeout)
		defer cancel()
		conn, err := t.db.Acquire(acquireCtx)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", recovery.ErrUnavailable, err)
		}
		// The BEGIN goes with the handler's first statement.
		t.conn, t.tx = conn, opentx.New(conn.Conn(), beginSQL, opentx.NewMark())
	}
	t.lent = true
	return t.tx, nil
}

// end closes the holder and ends its transaction: with commit, which
// commits it behind the check of its mark (and is called with nil when
// there was none), or, when commit is nil or fails, by rolling it back.
// The connection goes back to the pool.
func (t *txHolder) end(ctx context.Context, commit func(conn *pgxpool.Conn, mark string) error) error {
	t.mu.Lock()
	t.closed = errTxDone
	conn, tx, gate := t.conn, t.tx, t.gate
	t.conn, t.tx, t.gate = nil, nil, nil
	t.mu.Unlock()
	defer gate.Leave() // after the connection went back
	if tx != nil {
		tx.End() // a Tx the handler kept is refused from now on
	}
	var err error
	if commit != nil {
		mark := ""
		if tx != nil {
			err = tx.Open(ctx) // the handler sent nothing in it: the BEGIN is still to go
			mark = tx.Mark()
		}
		if err == nil {
			err = commit(conn, mark)
		}
	}
	if conn != nil {
		if commit == nil || err != nil {
			_, _ = conn.Exec(ctx, "rollback")
		}
		conn.Release()
	}
	return err
}

// Tx returns the transaction in which the middleware stores the handler's
// response, beginning it on first use (its BEGIN goes with the first
// statement): writes made in it commit together with the stored response,
// or not at all. The middleware ends it: its Commit and Rollback, and a
// statement that would end it, return an error (return an error status to
// roll it back), and once the handler returned, every call returns
// pgx.ErrTxClosed. Savepoints (its Begin) work as in any pgx.Tx.
func Tx(ctx context.Context) (pgx.Tx, error) {
	t, ok := ctx.Value(txKey{}).(*txHolder)
	if !ok {
		return nil, ErrNoTransaction
	}
	return t.get(ctx)
}

// closeUnused refuses every later Tx and reports true when the handler got
// no transaction; otherwise it changes nothing and reports false. An
// Atomic claim's transaction, which the handler did not use, is rolled back
// then and its connection released: the response is streamed and not
// stored, and a slow reader must not hold a connection meanwhile.
func (t *txHolder) closeUnused() bool {
	t.mu.Lock()
	if t.lent {
		t.mu.Unlock()
		return false
	}
	if t.closed == nil {
		t.closed = errTxStreamed
	}
	conn, tx, gate := t.conn, t.tx, t.gate
	t.conn, t.tx, t.gate = nil, nil, nil
	t.mu.Unlock()
	if conn != nil {
		tx.End()
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_, _ = conn.Exec(ctx, "rollback")
		conn.Release()
		gate.Leave()
	}
	return true
}

// aborted reports whether a statement failed in the transaction, which
// PostgreSQL then refuses to commit: the handler answered after an error
// it caught.
func (t *txHolder) aborted() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.conn != nil && t.conn.Conn().PgConn().TxStatus() == 'E'
}

// recorder buffers a handler's response, up to limit bytes of body. Past
// it, the response is over: it is sent on to w as it is written when the
// handler began no transaction (streamed), and dropped otherwise.
type recorder struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	limit    int64
	w        http.ResponseWriter
	tx       *txHolder
	over     bool // the body went over limit
	streamed bool // the response is being written to w
}

func (r *recorder) Header() http.Header { return r.header }

// WriteHeader records the first final status; informational (1xx)
// statuses are dropped, as the stored response has only the final one.
func (r *recorder) WriteHeader(status int) {
	if r.status == 0 && status >= 200 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	switch {
	case r.streamed:
		return r.w.Write(p)
	case r.over:
		return 0, errResponseTooLarge
	case int64(r.body.Len())+int64(len(p)) <= r.limit:
		return r.body.Write(p)
	}
	r.over = true
	buffered := r.body.Bytes()
	r.body = bytes.Buffer{}
	if !r.tx.closeUnused() {
		return 0, errResponseTooLarge
	}
	r.streamed = true
	maps.Copy(r.w.Header(), r.header)
	r.w.WriteHeader(r.status)
	if _, err := r.w.Write(buffered); err != nil {
		return 0, err
	}
	return r.w.Write(p)
}

// response is what the handler answered, as far as it was buffered.
func (r *recorder) response() recovery.Response {
	status := r.status
	if status == 0 {
		status = http.StatusOK
	}
	return recovery.Response{Status: status, Header: r.header, Body: r.body.Bytes()}
}
