package idemhttp

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"time"

	"github.com/onceflow/onceflow/internal/tracing"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// Validator is a request that can say what is wrong with it. Workflow
// answers 422 with the error, before any record is made.
type Validator interface {
	Validate() error
}

// WorkflowConfig configures Workflow: who makes a request and how its body
// is read. Tenant is required; the other fields have documented defaults.
// The fields mean what Config's of the same names mean.
type WorkflowConfig struct {
	// Tenant says whose request it is, as your authentication established
	// it; keys are scoped by it. Required. See Config.Tenant.
	Tenant func(*http.Request) (string, error)

	// Principal says who, within the tenant, makes the request; it is
	// passed to the engine with workflow.AsPrincipal. nil means the tenant
	// alone. See Config.Principal.
	Principal func(*http.Request) (string, error)

	// MaxBody is the largest request body, in bytes; a larger one is 413.
	// 0 means MaxBodyDefault.
	MaxBody int64

	// BodyTimeout bounds reading the request body (408 past it). 0 means
	// BodyTimeoutDefault. See Config.BodyTimeout.
	BodyTimeout time.Duration

	// Logger receives runs that failed for want of the database. nil
	// discards them.
	Logger *slog.Logger

	// KeyLifetime is how long a finished record is kept, advertised in
	// ExpiresHeader; set it to the pruner's Retention. 0 means
	// recovery.RetentionDefault; negative advertises nothing. See
	// Config.KeyLifetime.
	KeyLifetime time.Duration

	// MaxWait caps the wait a request may ask for with Prefer: wait=N
	// while its key is in flight. 0 means MaxWaitDefault; negative
	// disables waiting. See Config.MaxWait.
	MaxWait time.Duration

	// MaxWaiters bounds the requests waiting at once; past it, a request
	// answers 409 at once. 0 means MaxWaitersDefault. See
	// Config.MaxWaiters.
	MaxWaiters int

	// polled: see Config.polled.
	polled func()
}

// withDefaults returns cfg with each zero field set to its default.
func (cfg WorkflowConfig) withDefaults() WorkflowConfig {
	cfg.MaxBody = cmp.Or(cfg.MaxBody, MaxBodyDefault)
	cfg.BodyTimeout = cmp.Or(cfg.BodyTimeout, BodyTimeoutDefault)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	cfg.KeyLifetime = cmp.Or(cfg.KeyLifetime, recovery.RetentionDefault)
	cfg.MaxWait = cmp.Or(cfg.MaxWait, MaxWaitDefault)
	cfg.MaxWaiters = cmp.Or(cfg.MaxWaiters, MaxWaitersDefault)
	return cfg
}

// validate reports a missing Tenant or a negative bound.
func (cfg WorkflowConfig) validate() error {
	if cfg.Tenant == nil {
		return ErrNoTenant
	}
	if cfg.MaxBody < 0 || cfg.BodyTimeout < 0 || cfg.MaxWaiters < 0 {
		return fmt.Errorf("%w: MaxBody (%d), BodyTimeout (%s) and MaxWaiters (%d) must not be negative",
			recovery.ErrInvalidInput, cfg.MaxBody, cfg.BodyTimeout, cfg.MaxWaiters)
	}
	return nil
}

// Workflow returns a handler that runs wf for each request: it decodes the
// JSON body into a Req (strictly: unknown fields are 400, and field names
// match exactly, so "Amount" is unknown where the field is "amount"),
// validates it if
// it is a Validator (422), runs the workflow under the request's key and
// writes its response, with Idempotent-Replayed: true on a replay. A step's
// failure is 500 and the key stays resumable: a retry with the same key, or
// the sweeper, finishes the work.
//
// cfg.Tenant is required (without it, ErrNoTenant); the engine's own
// Config governs the rest (schema, lease, stored headers, database
// timeout, observer). The key is always required, and the fingerprint is
// the workflow's name and the decoded request: carry what the path says in
// the body.
//
// The run's spans (workflow.Config TracerProvider) join the trace the
// request's headers carry (traceparent, with otel's global propagator, or
// W3C Trace Context when none is set), unless the request's context has a
// span already (a handler wrapped by otelhttp, say).
//
// On a database nobody migrated for the engine, every request is 503 and
// the first one logs an error naming the command to run (see
// workflow.NewEngine).
func Workflow[Req, State any](engine *workflow.Engine, wf *workflow.Workflow[Req, State], cfg WorkflowConfig) (http.Handler, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := newCore(cfg)
	if err := engine.Register(wf); err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, p := c.identify(r)
		if p != nil {
			writeProblem(w, p)
			return
		}
		body, p := c.readBody(w, r)
		if p != nil {
			writeProblem(w, p)
			return
		}
		var req Req
		if p := decode(body, &req); p != nil {
			writeProblem(w, p)
			return
		}
		var (
			res   *workflow.Result
			asked time.Time // before the run's claim read the record and its completion
		)
		run := func() (err error) {
			asked = time.Now()
			res, err = wf.Run(tracing.Extract(r), engine, who.key, req, workflow.AsPrincipal(who.principal))
			return err
		}
		if err := c.waits.await(w, r, run(), run); err != nil {
			c.runFailed(w, r, err)
			return
		}
		if !res.Rejected {
			c.expires(w, asked.Add(-res.FinishedFor)) // FinishedFor is 0 for a run that finished now
		}
		writeResponse(w, res.Response, res.Replayed)
	}), nil
}

// decode reads a JSON request strictly and validates it. The body is
// canonicalized first, so 5e2 decodes into an integer as 500 would; a type
// that does not read the canonical form (a *big.Int reads no exponent,
// which the canonical form gives an integer of more than 21 digits) reads
// the body as sent.
func decode(body []byte, req any) *problem {
	canonical, err := recovery.Canonicalize(nil, body)
	if err != nil {
		return &problem{status: http.StatusBadRequest, detail: "the body is not valid JSON: " + err.Error()}
	}
	if p := decodeStrictly(canonical, req); p != nil {
		reflect.ValueOf(req).Elem().SetZero()
		if decodeStrictly(body, req) != nil {
			return p
		}
	}
	if err := exactNames(canonical, reflect.TypeOf(req)); err != nil {
		return &problem{status: http.StatusBadRequest, detail: "the body is not a valid request: " + err.Error()}
	}
	if v, ok := req.(Validator); ok {
		if err := v.Validate(); err != nil {
			return &problem{status: http.StatusUnprocessableEntity, detail: err.Error()}
		}
	}
	return nil
}

// decodeStrictly decodes the one JSON value in doc into req, refusing
// unknown fields.
func decodeStrictly(doc []byte, req any) *problem {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	if err := dec.Decode(req); err != nil {
		return &problem{status: http.StatusBadRequest, detail: "the body is not a valid request: " + err.Error()}
	}
	if dec.More() {
		return &problem{status: http.StatusBadRequest, detail: "the body holds more than one JSON value"}
	}
	return nil
}

// runFailed answers a run that returned an error. A step that deferred the
// request (phase.Defer) is 503 with Retry-After: the deferral, which the
// key now waits out.
func (c *core) runFailed(w http.ResponseWriter, r *http.Request, err error) {
	var (
		stepErr  *workflow.StepError
		deferred *phase.DeferError
	)
	if errors.As(err, &stepErr) || errors.Is(err, recovery.ErrInFlight) || errors.Is(err, workflow.ErrLeaseLost) {
		c.expires(w, time.Time{}) // the key's record is kept, in flight
	}
	switch {
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		return // the client is gone; the work stays resumable
	case errors.Is(err, workflow.ErrLeaseLost):
		writeProblem(w, &problem{status: http.StatusConflict, retryAfter: time.Second,
			detail: "another attempt took this request over; retry to get its answer"})
	case errors.As(err, &stepErr) && errors.As(err, &deferred):
		writeProblem(w, &problem{status: http.StatusServiceUnavailable, retryAfter: min(deferred.After, recovery.MaxDefer),
			detail: "the request waits for another system, which asked for time; it is kept and resumed then: retry with the same key after Retry-After"})
	case errors.As(err, &stepErr) && !stepErr.Foreign && recovery.Unavailable(err):
		writeProblem(w, &problem{status: http.StatusServiceUnavailable, retryAfter: time.Second,
			detail: "the database was lost part-way (a failover?); retry with the same key to resume the request"})
	case errors.As(err, &stepErr):
		writeProblem(w, &problem{status: http.StatusInternalServerError,
			detail: "the request failed part-way; retry with the same key to resume it"})
	case errors.Is(err, recovery.ErrInFlight), errors.Is(err, recovery.ErrMismatch), errors.Is(err, recovery.ErrInvalidInput),
		errors.Is(err, recovery.ErrForbidden), errors.Is(err, recovery.ErrNotMigrated), errors.Is(err, recovery.ErrParked):
		writeProblem(w, c.claimProblem(r, err))
	default:
		c.logger.ErrorContext(r.Context(), "workflow could not run", slog.Any("error", err))
		writeProblem(w, &problem{status: http.StatusServiceUnavailable, retryAfter: time.Second,
			detail: "the request could not be made safe to retry, so it was not run; retry shortly"})
	}
}
