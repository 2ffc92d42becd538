package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
// is stored (status, allow-listed headers, body) and every retry gets it
// again, with Idempotent-Replayed: true, without running the handler. The
// handler may make its writes in the transaction that stores the response
// (Tx). A response of 500 or more, or a panic, is not stored: the
// transaction rolls back, the claim is dropped, and a retry runs the
// handler again.
func Middleware(db workflow.DB, cfg Config) (func(http.Handler) http.Handler, error) {
	c, err := newCore(cfg)
	if err != nil {
		return nil, err
	}
	store, err := recovery.New(db, recovery.Config{Schema: cfg.Schema, ResponseHeaders: cfg.ResponseHeaders, Lease: cfg.Lease})
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return &middleware{core: c, db: db, store: store, next: next}
	}, nil
}

type middleware struct {
	*core
	db    workflow.DB
	store *recovery.Store
	next  http.Handler
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, p := m.key(r)
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
	rec, outcome, err := m.store.Claim(r.Context(), recovery.ClaimParams{Key: key, Workflow: op, Fingerprint: fingerprint(op, body)})
	m.observe(op, outcome, err)
	if err != nil {
		writeProblem(w, m.claimProblem(r, err))
		return
	}
	if outcome == recovery.OutcomeReplay {
		writeResponse(w, *rec.Response, true)
		return
	}
	m.serve(w, r, rec, body)
}

// serve runs the handler for a claimed key and stores its response.
func (m *middleware) serve(w http.ResponseWriter, r *http.Request, rec *recovery.Record, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	resp, t, ok := m.handle(r)
	if !ok || resp.Status >= 500 {
		t.rollback()
		m.forget(r, rec)
		if !ok {
			writeProblem(w, &problem{status: http.StatusInternalServerError, detail: "the request failed; it may be retried"})
			return
		}
		writeResponse(w, resp, false)
		return
	}
	if err := m.complete(r.Context(), t, rec, resp); err != nil {
		t.rollback()
		if errors.Is(err, recovery.ErrLeaseLost) {
			writeProblem(w, &problem{status: http.StatusConflict, retryAfter: time.Second,
				detail: "another attempt took this request over; retry to get its answer"})
			return
		}
		m.logger.ErrorContext(r.Context(), "could not store the response", slog.Any("error", err))
		writeProblem(w, &problem{status: http.StatusServiceUnavailable, retryAfter: time.Second,
			detail: "the response could not be stored; retry with the same key"})
		return
	}
	writeResponse(w, resp, false)
}

// unprotected runs the handler for a request without a key, on a route
// that allows it: nothing is claimed or stored, but Tx works the same, and
// its transaction commits unless the handler answers 500 or more.
func (m *middleware) unprotected(w http.ResponseWriter, r *http.Request) {
	resp, t, ok := m.handle(r)
	switch {
	case !ok:
		t.rollback()
		writeProblem(w, &problem{status: http.StatusInternalServerError, detail: "the request failed"})
		return
	case resp.Status >= 500:
		t.rollback()
	case t.tx != nil:
		_, err := t.conn.Exec(r.Context(), "commit")
		t.release()
		if err != nil {
			writeProblem(w, &problem{status: http.StatusServiceUnavailable, detail: "the request's writes could not be committed"})
			return
		}
	}
	writeResponse(w, resp, false)
}

// handle runs the handler with a transaction to lend (Tx) and a recorder,
// and returns its response, the transaction holder and whether it returned
// without panicking.
func (m *middleware) handle(r *http.Request) (recovery.Response, *txHolder, bool) {
	t := &txHolder{db: m.db}
	r = r.WithContext(context.WithValue(r.Context(), txKey{}, t))
	out := &recorder{header: http.Header{}}
	ok := m.run(out, r)
	return recovery.Response{Status: out.statusOr200(), Header: out.header, Body: out.body.Bytes()}, t, ok
}

// run calls the handler, reporting false if it panicked.
func (m *middleware) run(w http.ResponseWriter, r *http.Request) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			m.logger.ErrorContext(r.Context(), "handler panicked", slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
			ok = false
		}
	}()
	m.next.ServeHTTP(w, r)
	return true
}

// complete stores resp, with the handler's transaction when it opened one:
// the stored response and the COMMIT go in one round trip.
func (m *middleware) complete(ctx context.Context, t *txHolder, rec *recovery.Record, resp recovery.Response) error {
	if t.tx == nil {
		return m.store.Complete(ctx, rec.Fence(), resp)
	}
	err := m.store.CompleteAndCommit(ctx, t.conn, rec.Fence(), "", nil, resp)
	if err != nil {
		t.rollback()
		return err
	}
	t.release()
	return nil
}

// forget drops the claim of a request whose response is not stored, so
// that a retry runs the handler afresh.
func (m *middleware) forget(r *http.Request, rec *recovery.Record) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), cleanupTimeout)
	defer cancel()
	if err := m.store.DeleteUnstarted(ctx, rec.Fence()); err != nil {
		m.logger.WarnContext(ctx, "could not drop the claim of a failed request", slog.Any("error", err))
	}
}

type txKey struct{}

// txHolder begins the handler's transaction on first use, on a connection
// it holds until the response is stored.
type txHolder struct {
	db   workflow.DB
	conn *pgxpool.Conn
	tx   pgx.Tx
}

func (t *txHolder) rollback() {
	if t.conn != nil {
		_, _ = t.conn.Exec(context.Background(), "rollback")
		t.release()
	}
}

func (t *txHolder) release() {
	t.conn.Release()
	t.conn, t.tx = nil, nil
}

// Tx returns the transaction in which the middleware stores the handler's
// response, beginning it on first use: writes made in it commit together
// with the stored response, or not at all. Do not commit or roll it back.
func Tx(ctx context.Context) (pgx.Tx, error) {
	t, ok := ctx.Value(txKey{}).(*txHolder)
	if !ok {
		return nil, ErrNoTransaction
	}
	if t.tx == nil {
		conn, err := t.db.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{})
		if err != nil {
			conn.Release()
			return nil, err
		}
		t.conn, t.tx = conn, tx
	}
	return t.tx, nil
}

// recorder buffers a handler's response.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}

func (r *recorder) statusOr200() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}
