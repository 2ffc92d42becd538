package idemhttp

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// MaxBodyDefault is the largest request body read: 1 MiB.
const MaxBodyDefault = 1 << 20

// Config configures Middleware and Workflow. The zero value is ready to use.
type Config struct {
	// Schema holds onceflow's tables; "" means "public".
	Schema string

	// Tenant says whose request it is; keys are scoped by it. An empty
	// answer is 401. nil means TenantFromHeader("X-Tenant-ID"); take it from
	// your authentication instead where you can.
	Tenant func(*http.Request) string

	// Operation names the route for the fingerprint and the record. nil
	// means the method and the ServeMux pattern that matched (or the path):
	// "POST /v1/checkouts".
	Operation func(*http.Request) string

	// MaxBody is the largest request body, in bytes; a larger one is 413. 0
	// means MaxBodyDefault.
	MaxBody int64

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

	// DBTimeout bounds the database work done before the handler runs
	// (taking a connection and claiming the key) and taking the connection
	// for Tx: past it, the answer is 503 with Retry-After and the handler
	// does not run. 0 means workflow.DBTimeoutDefault (5s). Also set the
	// pool's connect_timeout. idemhttp.Workflow takes it from the engine's
	// Config instead.
	DBTimeout time.Duration

	// ResponseHeaders are the response headers stored and replayed. nil
	// means recovery.DefaultResponseHeaders.
	ResponseHeaders []string

	// Logger receives storage failures and panics. nil discards them.
	Logger *slog.Logger

	// Observer, if set, is told of every claim (metrics.Metrics is one).
	Observer workflow.Observer
}

// core is what Middleware and Workflow share.
type core struct {
	tenant    func(*http.Request) string
	operation func(*http.Request) string
	maxBody   int64
	dbTimeout time.Duration
	optional  bool
	logger    *slog.Logger
	observer  workflow.Observer
}

func newCore(cfg Config) (*core, error) {
	if cfg.MaxBody < 0 || cfg.DBTimeout < 0 {
		return nil, fmt.Errorf("%w: MaxBody (%d) and DBTimeout (%s) must not be negative", recovery.ErrInvalidInput, cfg.MaxBody, cfg.DBTimeout)
	}
	c := &core{
		tenant:    cfg.Tenant,
		operation: cfg.Operation,
		maxBody:   cmp.Or(cfg.MaxBody, MaxBodyDefault),
		dbTimeout: cmp.Or(cfg.DBTimeout, workflow.DBTimeoutDefault),
		optional:  cfg.KeyOptional,
		logger:    cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
		observer:  cfg.Observer,
	}
	if c.tenant == nil {
		c.tenant = TenantFromHeader(TenantHeaderDefault)
	}
	if c.operation == nil {
		c.operation = routeOf
	}
	return c, nil
}

// routeOf names a request by its method and matched ServeMux pattern, or
// its path where no pattern matched. The name is stored with the key, so it
// keeps to the input rules: a path that would break them (too long, or
// holding %00 or %FF) is named by its escaped form, cut to MaxKeyLength.
// The fingerprint covers the whole path either way.
func routeOf(r *http.Request) string {
	route := r.URL.Path
	if r.Pattern != "" {
		route = r.Pattern
	}
	if _, path, found := cutMethod(route); found {
		route = path // the pattern already names the method
	}
	name := r.Method + " " + route
	if recovery.CheckName("operation", name) != nil {
		name = r.Method + " " + r.URL.EscapedPath()
		name = name[:min(len(name), recovery.MaxKeyLength)]
	}
	return name
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

// readBody reads the whole body, up to the limit.
func (c *core) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *problem) {
	if r.Body == nil {
		return nil, nil
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, c.maxBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, &problem{status: http.StatusRequestEntityTooLarge, detail: fmt.Sprintf("the body is larger than %d bytes", c.maxBody)}
	case err != nil:
		return nil, &problem{status: http.StatusBadRequest, detail: "could not read the body: " + err.Error()}
	}
	return body, nil
}

// problem is an error answer, written as RFC 9457 problem details.
type problem struct {
	status     int
	detail     string
	retryAfter time.Duration
	noKey      bool // the request had no Idempotency-Key
}

// claimProblem maps a claim's error to the answer; nil for none.
func (c *core) claimProblem(r *http.Request, err error) *problem {
	var inFlight *recovery.InFlightError
	switch {
	case errors.As(err, &inFlight):
		return &problem{status: http.StatusConflict, retryAfter: inFlight.RetryAfter,
			detail: "a request with this Idempotency-Key is still in progress; retry shortly"}
	case errors.Is(err, recovery.ErrMismatch):
		return &problem{status: http.StatusUnprocessableEntity,
			detail: "this Idempotency-Key was used with a different request"}
	case errors.Is(err, recovery.ErrInvalidInput):
		return &problem{status: http.StatusBadRequest, detail: err.Error()}
	}
	c.logger.ErrorContext(r.Context(), "idempotency storage unavailable; the request was not run",
		slog.String("operation", c.operation(r)), slog.Any("error", err))
	return &problem{status: http.StatusServiceUnavailable, retryAfter: time.Second,
		detail: "the request could not be made safe to retry, so it was not run; retry shortly"}
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
	writeResponse(w, resp, false)
}

// writeResponse writes resp, marking a replay.
func writeResponse(w http.ResponseWriter, resp recovery.Response, replayed bool) {
	for name, values := range resp.Header {
		w.Header()[name] = values
	}
	if replayed {
		w.Header().Set(ReplayedHeader, "true")
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// fingerprint covers the operation, the request's path and query (a
// route's pattern does not say which resource it names) and the body; a
// JSON body is canonicalized, anything else is taken byte for byte.
func fingerprint(op string, r *http.Request, body []byte) recovery.Fingerprint {
	target := op + " " + r.URL.EscapedPath() + "?" + r.URL.RawQuery
	if len(body) > 0 {
		if fp, _, err := recovery.FingerprintJSON(target, body); err == nil {
			return fp
		}
	}
	return recovery.FingerprintBytes(target, body)
}
