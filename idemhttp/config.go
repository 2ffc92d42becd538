package idemhttp

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onceflow/onceflow/internal/canonjson"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// MaxBodyDefault is the largest request body read: 1 MiB.
const MaxBodyDefault = 1 << 20

// BodyTimeoutDefault is how long reading a request's body may take.
const BodyTimeoutDefault = 10 * time.Second

// MaxResponseDefault is the largest response the middleware stores: 1 MiB.
const MaxResponseDefault = 1 << 20

// UnmatchedOperation names a request that no ServeMux pattern matched (a
// middleware in front of the mux, or a handler served directly): a fixed
// name, so that random paths make neither metric series nor operation
// names. The fingerprint still covers the method and the path.
const UnmatchedOperation = "unmatched route"

// Config configures Middleware (Workflow takes a WorkflowConfig). Tenant is
// required; the other fields have documented defaults.
//
// The middleware decides who may see a stored response: only a request
// whose Tenant and Principal are those of the request that made the record
// gets it replayed. Put it after your authentication, and derive both from
// what the authentication established, never from what the client states.
type Config struct {
	// Schema holds onceflow's tables; "" means "public".
	Schema string

	// Tenant says whose request it is, as your authentication established
	// it; keys are scoped by it, so two tenants never share a record.
	// Required: Middleware returns ErrNoTenant without it. An
	// error (or an empty tenant) is 401, unless the error is a
	// *RequestError, whose status and detail are used. Behind a proxy that
	// authenticates and sets a header, use TenantFromTrustedHeader.
	Tenant func(*http.Request) (string, error)

	// Principal says who, within the tenant, makes the request (a user, an
	// API client). Its SHA-256 is stored with the record, and a request
	// with the same key from any other principal is 403, whatever the
	// record holds, with nothing run and nothing of the record told. Errors
	// are answered as Tenant's. nil means the tenant alone: every caller
	// of a tenant may get any of the tenant's stored responses.
	Principal func(*http.Request) (string, error)

	// Operation names the route for the fingerprint and the record. nil
	// means the method and the ServeMux pattern that matched, "POST
	// /v1/checkouts", or UnmatchedOperation where none did. Keep the names
	// few: each is a metric label.
	Operation func(*http.Request) string

	// MaxBody is the largest request body, in bytes; a larger one is 413,
	// answered before "100 Continue" when Content-Length says so. 0 means
	// MaxBodyDefault.
	MaxBody int64

	// BodyTimeout bounds reading the request body: past it, the answer is
	// 408 and the connection is closed, so that slow clients cannot hold
	// memory for long. 0 means BodyTimeoutDefault. It needs a
	// ResponseWriter that supports http.ResponseController's
	// SetReadDeadline (net/http's does; a wrapping writer must have an
	// Unwrap method); with any other, the body is read without a bound in
	// time.
	BodyTimeout time.Duration

	// MaxResponse is the largest response body the middleware stores, in
	// bytes. A response over it is not stored, and its claim is dropped, so
	// that a retry runs the handler again: when the handler made no writes
	// through Tx, the client gets the response, streamed; when it did, its
	// transaction rolls back and the answer is 500 (the response could be
	// neither stored nor sent without the writes it reports). Either way it
	// is logged. 0 means MaxResponseDefault.
	MaxResponse int64

	// Store says whether a response of the given status is stored and
	// replayed. A response that is not stored is answered as it is, its
	// Tx writes roll back and its claim is dropped, so that a retry runs the
	// handler again. nil means StoreDefault.
	Store func(status int) bool

	// KeyOptional lets a request without an Idempotency-Key through to the
	// handler, unprotected, instead of answering 400.
	KeyOptional bool

	// Lease is how long the middleware holds a key while its handler runs
	// (0 means recovery.LeaseDefault, 30s). The lease is renewed every third
	// of it while the handler runs; when no renewal succeeded for nine
	// tenths of it, the handler's context is cancelled, before another
	// request could take the key over. Keep handlers well within it; longer
	// work belongs in a workflow.
	Lease time.Duration

	// Atomic says that the handler's effects are all writes through Tx:
	// it calls no other system, sends no mail, writes no file. Then the
	// claim opens the request's transaction, and the handler's writes and
	// the stored response commit in it, once, as an atomic phase of a
	// workflow does: one commit per request instead of two (the claim's
	// own, then the response's). A duplicate meanwhile is answered 409 at
	// once by the key's lock; a request that fails, is not stored or
	// whose process dies leaves nothing, and its retry runs the handler
	// afresh. The price: the request holds a connection, in a
	// transaction, from the claim to the response, and no lease bounds
	// the handler (no one else can take the key while its transaction is
	// open), so keep such handlers short and give them a deadline.
	// Atomic requests, and the attempts of workflow engines on the same
	// *pgxpool.Pool, together hold at most all but one of its
	// connections (more wait, within DBTimeout, then get 503): the last is
	// left for a handler's second connection and for lease renewals;
	// IdleTimeout bounds a handler whose process went silent. A
	// response over MaxResponse from a handler that never called Tx is
	// still streamed, and nothing is kept.
	//
	// Leave it false for a handler with any effect outside the database:
	// its claim must commit first, so that a duplicate is kept out by the
	// lease after a crash instead of running the handler's calls again at
	// once.
	Atomic bool

	// IdleTimeout bounds how long an Atomic request's transaction may wait
	// on its handler between statements: past it, PostgreSQL ends the
	// transaction, rolling the handler's writes back, so that a process
	// frozen or cut off from the server frees the key instead of holding
	// it until TCP keepalives notice, hours by default. A live handler
	// that waits that long is ended too (its Tx statements fail). A role
	// or session that sets its own idle_in_transaction_session_timeout
	// keeps it. 0 means recovery.IdleTimeoutDefault (1 minute); negative
	// sets nothing. Without Atomic the claim commits on its own and a
	// lease bounds the key instead.
	IdleTimeout time.Duration

	// DBTimeout bounds the database work done before the handler runs
	// (taking a connection and claiming the key) and taking the connection
	// for Tx: past it, the answer is 503 with Retry-After and the handler
	// does not run. 0 means workflow.DBTimeoutDefault (5s). Also set the
	// pool's connect_timeout.
	DBTimeout time.Duration

	// KeyLifetime is how long a finished record is kept, which every
	// answer about a key that has a record advertises in ExpiresHeader. Set
	// it to the pruner's Retention (sweeper.PrunerConfig): 0 means
	// recovery.RetentionDefault (24h), the pruner's default; negative
	// advertises nothing.
	KeyLifetime time.Duration

	// MaxWait caps the wait a request may ask for with Prefer: wait=N
	// (RFC 7240) when its key is in flight: the request polls the key
	// until it is finished or free, instead of answering 409 at once. 0
	// means MaxWaitDefault (10s); negative disables waiting.
	MaxWait time.Duration

	// MaxWaiters bounds the requests waiting at once (Prefer: wait) for
	// the handlers this middleware wraps; past it, a request answers 409
	// at once. 0 means MaxWaitersDefault (1000); it must not be negative.
	MaxWaiters int

	// ResponseHeaders are the response headers stored and replayed. nil
	// means recovery.DefaultResponseHeaders. Set-Cookie and ExpiresHeader
	// are never stored.
	ResponseHeaders []string

	// Logger receives storage failures, responses too large to store and
	// panics. nil discards them.
	Logger *slog.Logger

	// Observer, if set, is told of every claim (metrics.Metrics is one).
	Observer workflow.Observer

	// polled, when set, is called by a waiting request after each claim
	// that found its key in flight, holding no connection (tests).
	polled func()
}

// withDefaults returns cfg with each zero field set to its default. The
// schema, lease and stored headers are the store's to fill
// (recovery.Config).
func (cfg Config) withDefaults() Config {
	shared := cfg.shared().withDefaults()
	cfg.MaxBody, cfg.BodyTimeout, cfg.Logger = shared.MaxBody, shared.BodyTimeout, shared.Logger
	cfg.KeyLifetime, cfg.MaxWait, cfg.MaxWaiters = shared.KeyLifetime, shared.MaxWait, shared.MaxWaiters
	cfg.MaxResponse = cmp.Or(cfg.MaxResponse, MaxResponseDefault)
	cfg.DBTimeout = cmp.Or(cfg.DBTimeout, workflow.DBTimeoutDefault)
	if cfg.Operation == nil {
		cfg.Operation = routeOf
	}
	if cfg.Store == nil {
		cfg.Store = StoreDefault
	}
	return cfg
}

// validate reports a missing Tenant or a bound, with its default filled in,
// that is negative.
func (cfg Config) validate() error {
	if err := cfg.shared().validate(); err != nil {
		return err
	}
	if cfg.DBTimeout < 0 || cfg.MaxResponse < 0 {
		return fmt.Errorf("%w: MaxResponse (%d) and DBTimeout (%s) must not be negative",
			recovery.ErrInvalidInput, cfg.MaxResponse, cfg.DBTimeout)
	}
	return nil
}

// shared returns the fields of cfg that Workflow has too.
func (cfg Config) shared() WorkflowConfig {
	return WorkflowConfig{Tenant: cfg.Tenant, Principal: cfg.Principal, MaxBody: cfg.MaxBody,
		BodyTimeout: cfg.BodyTimeout, Logger: cfg.Logger, KeyLifetime: cfg.KeyLifetime,
		MaxWait: cfg.MaxWait, MaxWaiters: cfg.MaxWaiters, polled: cfg.polled}
}

// StoreDefault is the default Config.Store. It stores every final response
// but temporary refusals and failures, which a retry should not get again
// once their cause is gone: 401, 403, 407, 408, 425, 429 and 5xx.
func StoreDefault(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired,
		http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

// ErrNoTenant reports a Config without Tenant.
var ErrNoTenant = errors.New("idemhttp: Config.Tenant is required: say how a request's tenant is authenticated (or use TenantFromTrustedHeader behind an authenticating proxy)")

// RequestError is an error from Config.Tenant or Config.Principal that
// says how to answer: with Status (4xx or 5xx; any other is 401) and
// Detail, as problem details.
type RequestError struct {
	Status int
	Detail string
}

// Error returns the status and the detail.
func (e *RequestError) Error() string { return fmt.Sprintf("%d %s", e.Status, e.Detail) }

// core is what Middleware and Workflow share.
type core struct {
	tenant      func(*http.Request) (string, error)
	principal   func(*http.Request) (string, error)
	operation   func(*http.Request) string
	maxBody     int64
	bodyTimeout time.Duration
	dbTimeout   time.Duration
	optional    bool
	logger      *slog.Logger
	observer    workflow.Observer
	keyLifetime time.Duration // negative: not advertised
	waits       *waiter

	// notMigratedLogged is set once the handler has logged that the
	// database is not migrated: said once clearly, not once a request.
	notMigratedLogged atomic.Bool
}

// newCore returns the core of a handler configured by cfg, its defaults
// filled in; a middleware sets the rest.
func newCore(cfg WorkflowConfig) *core {
	return &core{
		tenant:      cfg.Tenant,
		principal:   cfg.Principal,
		operation:   routeOf,
		maxBody:     cfg.MaxBody,
		bodyTimeout: cfg.BodyTimeout,
		dbTimeout:   workflow.DBTimeoutDefault,
		logger:      cfg.Logger,
		keyLifetime: cfg.KeyLifetime,
		waits:       &waiter{max: cfg.MaxWait, limit: int64(cfg.MaxWaiters), polled: cfg.polled},
	}
}

// routeOf names a request by its ServeMux pattern, "POST /v1/checkouts", or
// UnmatchedOperation where no pattern matched: a request's path and method
// are the client's to choose, and the name is a metric label and is stored
// with the key. A pattern without a method is named with the request's
// method when it is a standard one, else "OTHER". A name that would break
// the input rules is cut to MaxKeyLength. The fingerprint covers the
// method and the whole path either way.
func routeOf(r *http.Request) string {
	if r.Pattern == "" {
		return UnmatchedOperation
	}
	method, path, found := cutMethod(r.Pattern)
	if !found {
		method = "OTHER"
		if slices.Contains(standardMethods, r.Method) {
			method = r.Method
		}
	}
	name := method + " " + path
	if recovery.CheckName("operation", name) != nil {
		name = strings.ToValidUTF8(name[:min(len(name), recovery.MaxKeyLength)], "")
	}
	if recovery.CheckName("operation", name) != nil {
		return UnmatchedOperation
	}
	return name
}

// standardMethods are the methods of RFC 9110 and PATCH.
var standardMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace,
}

func cutMethod(pattern string) (method, path string, found bool) {
	for i, c := range pattern {
		if c == ' ' {
			return pattern[:i], pattern[i+1:], true
		}
		if c == '/' {
			break
		}
	}
	return "", pattern, false
}

// readBody reads the whole body, up to the size limit and within the time
// limit. A Content-Length over the size limit is refused before reading,
// so a client that asked for "100 Continue" never gets it.
func (c *core) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *problem) {
	tooLarge := &problem{status: http.StatusRequestEntityTooLarge, detail: fmt.Sprintf("the body is larger than %d bytes", c.maxBody), closeConn: true}
	if r.ContentLength > c.maxBody {
		return nil, tooLarge
	}
	if r.Body == nil {
		return nil, nil
	}
	// Cut the read off once the body timeout has passed, by moving the
	// connection's read deadline to that moment then: setting it ahead now
	// would lift a shorter deadline the server set (http.Server.ReadTimeout).
	var (
		deadline = http.NewResponseController(w)
		mu       sync.Mutex
		read     bool
	)
	cutOff := time.AfterFunc(c.bodyTimeout, func() {
		mu.Lock()
		defer mu.Unlock()
		if !read {
			_ = deadline.SetReadDeadline(time.Now())
		}
	})
	body, err := readAll(http.MaxBytesReader(w, r.Body, c.maxBody))
	mu.Lock()
	read = true
	mu.Unlock()
	cut := !cutOff.Stop()
	if cut && err == nil {
		_ = deadline.SetReadDeadline(time.Time{}) // read whole just in time: keep the connection usable
	}
	var overLimit *http.MaxBytesError
	switch {
	case errors.As(err, &overLimit):
		return nil, tooLarge
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Whose deadline it was: ours, or the server's (ReadTimeout).
		detail := "the request did not arrive within the server's read timeout"
		if cut {
			detail = fmt.Sprintf("the body did not arrive within %s", c.bodyTimeout)
		}
		return nil, &problem{status: http.StatusRequestTimeout, closeConn: true, detail: detail}
	case err != nil:
		return nil, &problem{status: http.StatusBadRequest, detail: "could not read the body: " + err.Error()}
	}
	return body, nil
}

// readChunk is the largest piece readAll reads into.
const readChunk = 32 << 10

// readAll reads r to its end, like io.ReadAll, into pieces of at most
// readChunk bytes that it joins once the whole body is in. A read that
// fails drops what came; io.ReadAll would first copy it into one slice,
// which, when the slow bodies of many connections are cut off at once,
// doubles the memory they hold at that moment.
func readAll(r io.Reader) ([]byte, error) {
	var pieces [][]byte
	piece := make([]byte, 0, 512)
	for {
		n, err := r.Read(piece[len(piece):cap(piece)])
		piece = piece[:len(piece)+n]
		switch {
		case err == io.EOF && len(pieces) == 0:
			return piece, nil
		case err == io.EOF:
			return slices.Concat(append(pieces, piece)...), nil
		case err != nil:
			return nil, err
		case len(piece) == cap(piece):
			pieces = append(pieces, piece)
			piece = make([]byte, 0, min(2*cap(piece), readChunk))
		}
	}
}

// problem is an error answer, written as RFC 9457 problem details.
type problem struct {
	status     int
	detail     string
	retryAfter time.Duration
	noKey      bool // the request had no Idempotency-Key
	closeConn  bool // the body was not read whole: close the connection
}

// forbidden answers a key whose record another principal made. It is the
// same whatever the record holds or whether it finished.
var forbidden = &problem{status: http.StatusForbidden, detail: "this Idempotency-Key cannot be used by this caller"}

// claimProblem maps a claim's error to the answer; nil for none.
func (c *core) claimProblem(r *http.Request, err error) *problem {
	var inFlight *recovery.InFlightError
	switch {
	case errors.As(err, &inFlight) && inFlight.Deferred:
		return &problem{status: http.StatusConflict, retryAfter: inFlight.RetryAfter,
			detail: "the request with this Idempotency-Key waits for another system, which asked for time; retry after Retry-After"}
	case errors.As(err, &inFlight):
		return &problem{status: http.StatusConflict, retryAfter: inFlight.RetryAfter,
			detail: "a request with this Idempotency-Key is still in progress; retry shortly"}
	case errors.Is(err, recovery.ErrForbidden):
		return forbidden
	case errors.Is(err, recovery.ErrMismatch):
		return &problem{status: http.StatusUnprocessableEntity,
			detail: "this Idempotency-Key was used with a different request"}
	case errors.Is(err, recovery.ErrInvalidInput):
		return &problem{status: http.StatusBadRequest, detail: err.Error()}
	case errors.Is(err, recovery.ErrNotMigrated):
		return c.notMigrated(r, err)
	case errors.Is(err, recovery.ErrParked):
		return parked
	}
	c.logger.ErrorContext(r.Context(), "idempotency storage unavailable; the request was not run",
		slog.String("operation", c.operation(r)), slog.Any("error", err))
	return &problem{status: http.StatusServiceUnavailable, retryAfter: time.Second,
		detail: "the request could not be made safe to retry, so it was not run; retry shortly"}
}

// parkedRetryAfter is the Retry-After of a 503 for a parked record: an
// operator has to act first.
const parkedRetryAfter = 60 * time.Second

// parked answers a key whose record is parked (workflow.ErrParked): the
// running version of the workflow may not resume it. Nothing ran; the
// answer is the same on every retry until an operator resolves the record,
// and says nothing of the record.
var parked = &problem{status: http.StatusServiceUnavailable, retryAfter: parkedRetryAfter,
	detail: "this request is waiting for an operator: it was started by an earlier version of the service, which this one cannot safely continue; nothing was run again; retry later with the same key"}

// notMigratedRetryAfter is the Retry-After of a 503 for an unmigrated
// database: an operator has to act first.
const notMigratedRetryAfter = 30 * time.Second

// notMigrated answers a request that found onceflow's tables missing or
// older than this build: 503, nothing run. The first such request logs the
// error, which names the schema and the command to run, at Error; later
// ones at Debug.
func (c *core) notMigrated(r *http.Request, err error) *problem {
	level := slog.LevelDebug
	if c.notMigratedLogged.CompareAndSwap(false, true) {
		level = slog.LevelError
	}
	c.logger.Log(r.Context(), level, "the database is not migrated for onceflow; every request is answered 503 until it is",
		slog.Any("error", err))
	return &problem{status: http.StatusServiceUnavailable, retryAfter: notMigratedRetryAfter,
		detail: "the service's storage is not set up yet, so the request was not run; retry later"}
}

func (c *core) observe(op string, outcome recovery.Outcome, err error) {
	if c.observer == nil {
		return
	}
	var inFlight *recovery.InFlightError
	switch {
	case errors.As(err, &inFlight):
		c.observer.Claimed(op, workflow.ClaimConflict)
	case errors.Is(err, recovery.ErrMismatch):
		c.observer.Claimed(op, workflow.ClaimMismatch)
	case errors.Is(err, recovery.ErrForbidden):
		c.observer.Claimed(op, workflow.ClaimForbidden)
	case err == nil:
		c.observer.Claimed(op, outcome.String())
	}
}

// writeProblem answers with p as application/problem+json.
func writeProblem(w http.ResponseWriter, p *problem) {
	resp := workflow.Problem(p.status, p.detail)
	if p.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(p.retryAfter.Seconds()))))
	}
	if p.closeConn {
		w.Header().Set("Connection", "close")
	}
	writeResponse(w, resp, false)
}

// writeResponse writes resp, marking a replay. ExpiresHeader is not
// resp's to say: only the answer (core.expires) says it.
func writeResponse(w http.ResponseWriter, resp recovery.Response, replayed bool) {
	for name, values := range resp.Header {
		if name != ExpiresHeader {
			w.Header()[name] = values
		}
	}
	if replayed {
		w.Header().Set(ReplayedHeader, "true")
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// fingerprint covers the operation, the method, the request's path and
// query (a route's pattern does not say which resource it names), the
// media type and the body. The body is canonicalized as JSON only when the
// media type says it is JSON (application/json or a +json type); any other
// body is taken byte for byte, so a text body that happens to parse as JSON
// matches only itself. So is a JSON body that the canonical form cannot
// stand for: one that is not JSON, or whose meaning to the handler may
// depend on its member order, which the canonical form drops (a name
// given twice in an object, which canonicalizing refuses, or two names
// that encoding/json reads as one, "amount" and "AMOUNT").
func fingerprint(op string, r *http.Request, body []byte) recovery.Fingerprint {
	mediaType := mediaTypeOf(r)
	target := strings.Join([]string{strconv.Quote(op), strconv.Quote(r.Method),
		strconv.Quote(r.URL.EscapedPath() + "?" + r.URL.RawQuery), strconv.Quote(mediaType)}, " ")
	if len(body) > 0 && isJSON(mediaType) {
		fp, canonical, err := recovery.FingerprintJSON(target, body)
		if err == nil {
			collide, _ := canonjson.NamesCollide(canonical) // canonical is JSON: no error
			if !collide {
				return fp
			}
		}
	}
	return recovery.FingerprintBytes(target, body)
}

// mediaTypeOf returns the request's Content-Type in one spelling: type and
// parameter names lowercased, parameters sorted. A value that does not
// parse is kept as sent, every copy of it.
func mediaTypeOf(r *http.Request) string {
	values := r.Header.Values("Content-Type")
	if len(values) == 1 {
		if mt, params, err := mime.ParseMediaType(values[0]); err == nil {
			if formatted := mime.FormatMediaType(mt, params); formatted != "" {
				return formatted
			}
		}
	}
	return strings.Join(values, "\n")
}

// isJSON reports a JSON media type: application/json or any +json type.
func isJSON(mediaType string) bool {
	mt, _, _ := strings.Cut(mediaType, ";")
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}
