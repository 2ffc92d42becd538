package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// MaxBodyBytes is the largest request body the HTTP API reads.
const MaxBodyBytes = 64 << 10

// Handler returns the HTTP JSON API (under /api/) and the console (at /).
// Every request is authorized by Config.Authorize: a GET needs RoleRead, a
// POST RoleWrite. A POST must carry a JSON body (Content-Type
// application/json, which a cross-origin page cannot send without a CORS
// preflight this handler never grants) and pass
// net/http.CrossOriginProtection (Sec-Fetch-Site, Origin), so that a page on
// another origin cannot make an operator's browser act. Errors are
// application/problem+json.
//
// To mount it under a prefix, strip the prefix:
//
//	mux.Handle("/ops/", http.StripPrefix("/ops", a.Handler()))
//
// The API:
//
//	GET  /api/role                                      {"role": "read"} or {"role": "write"}: what the caller may do
//	GET  /api/keys?tenant=&workflow=&status=&stuck_for=10m&created_from=RFC3339&created_to=&newest=true&limit=&cursor=
//	GET  /api/keys/{tenant}/{key}                       (Show; escape a / in a key as %2F)
//	POST /api/keys/{tenant}/{key}/release                {"owner": "...", "force": false, "reason": "..."}
//	POST /api/keys/{tenant}/{key}/fail                   (the same body)
//	POST /api/keys/{tenant}/{key}/resume                 (the same body)
//	GET  /api/outbox/dead?topic=&after=&limit=
//	POST /api/outbox/{id}/retry
//	POST /api/bulk/{action}                              {"filter": {"status": "in_flight", "stuck_for": "10m"}, "force": false, "reason": "..."}
//
// where a bulk action is release, fail, resume, or retry (dead outbox
// messages; its filter takes topic).
func (a *Admin) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/role", a.serveRole)
	mux.HandleFunc("GET /api/keys", a.serveList)
	mux.HandleFunc("GET /api/keys/{tenant}/{key}", a.serveShow)
	mux.HandleFunc("POST /api/keys/{tenant}/{key}/{action}", a.serveAction)
	mux.HandleFunc("GET /api/outbox/dead", a.serveDead)
	mux.HandleFunc("POST /api/outbox/{id}/retry", a.serveRetry)
	mux.HandleFunc("POST /api/bulk/{action}", a.serveBulk)
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusNotFound, "no such API endpoint: "+r.Method+" "+r.URL.Path)
	})
	a.mountConsole(mux)
	return a.guard(mux)
}

// guard authorizes each request and keeps state-changing ones from other
// origins out.
func (a *Admin) guard(next http.Handler) http.Handler {
	csrf := http.NewCrossOriginProtection()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		safe := r.Method == http.MethodGet || r.Method == http.MethodHead
		if !safe {
			if err := csrf.Check(r); err != nil {
				writeProblem(w, http.StatusForbidden, "cross-origin request refused: "+err.Error())
				return
			}
		}
		role, err := a.auth(r)
		switch {
		case errors.Is(err, ErrForbidden):
			writeProblem(w, http.StatusForbidden, "forbidden")
			return
		case err != nil:
			writeProblem(w, http.StatusUnauthorized, "authentication required")
			return
		case role < RoleRead:
			writeProblem(w, http.StatusForbidden, "no access")
			return
		case !safe && role < RoleWrite:
			writeProblem(w, http.StatusForbidden, "the read-only role may not act")
			return
		}
		if !safe {
			media, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
			if err != nil || media != "application/json" {
				writeProblem(w, http.StatusUnsupportedMediaType, "a request that acts must be application/json")
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), roleKey{}, role)))
	})
}

// roleKey keys the request's role in its context.
type roleKey struct{}

// RoleOf returns the role Config.Authorize gave the request being served
// by the Handler; RoleNone outside it.
func RoleOf(ctx context.Context) Role {
	r, _ := ctx.Value(roleKey{}).(Role)
	return r
}

func (a *Admin) serveRole(w http.ResponseWriter, r *http.Request) {
	a.reply(w, struct {
		Role Role `json:"role"`
	}{RoleOf(r.Context())}, nil)
}

func (a *Admin) serveList(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r.URL.Query(), true)
	if err != nil {
		a.writeError(w, err)
		return
	}
	page, err := a.List(r.Context(), f)
	a.reply(w, page, err)
}

func (a *Admin) serveShow(w http.ResponseWriter, r *http.Request) {
	d, err := a.Show(r.Context(), pathKey(r))
	a.reply(w, d, err)
}

func (a *Admin) serveAction(w http.ResponseWriter, r *http.Request) {
	one, err := a.action(Kind(r.PathValue("action")))
	if err != nil {
		writeProblem(w, http.StatusNotFound, err.Error())
		return
	}
	var act Action
	if err := decode(r, &act); err != nil {
		a.writeError(w, err)
		return
	}
	rec, err := one(r.Context(), pathKey(r), act)
	a.reply(w, rec, err)
}

func (a *Admin) serveDead(w http.ResponseWriter, r *http.Request) {
	f, err := parseDeadFilter(r.URL.Query(), true)
	if err != nil {
		a.writeError(w, err)
		return
	}
	page, err := a.Dead(r.Context(), f)
	a.reply(w, page, err)
}

func (a *Admin) serveRetry(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		a.writeError(w, fmt.Errorf("%w: message id %q is not a number", ErrInvalidInput, r.PathValue("id")))
		return
	}
	if err := a.RetryDead(r.Context(), id); err != nil {
		a.writeError(w, err)
		return
	}
	a.reply(w, struct {
		ID int64 `json:"id"`
	}{id}, nil)
}

// bulkBody is a bulk request's body: the filter's fields are those of the
// listing's query (GET /api/keys), as strings.
type bulkBody struct {
	Filter map[string]string `json:"filter"`
	Force  bool              `json:"force"`
	Reason string            `json:"reason"`
}

func (a *Admin) serveBulk(w http.ResponseWriter, r *http.Request) {
	var body bulkBody
	if err := decode(r, &body); err != nil {
		a.writeError(w, err)
		return
	}
	q := url.Values{}
	for k, v := range body.Filter {
		q.Set(k, v)
	}
	var (
		rep *Report
		err error
	)
	if action := r.PathValue("action"); action == "retry" {
		var f DeadFilter
		if f, err = parseDeadFilter(q, false); err == nil {
			rep, err = a.BulkRetryDead(r.Context(), f)
		}
	} else {
		var f Filter
		if f, err = parseFilter(q, false); err == nil {
			rep, err = a.Bulk(r.Context(), Bulk{Action: Kind(action), Filter: f, Force: body.Force, Reason: body.Reason})
		}
	}
	a.reply(w, rep, err)
}

// pathKey is the key the request's path names.
func pathKey(r *http.Request) recovery.Key {
	return recovery.Key{Tenant: r.PathValue("tenant"), ID: r.PathValue("key")}
}

// parseFilter reads a listing's query; paging (limit, cursor) only when
// page. An unknown parameter is an error, so that a misspelt filter does
// not match everything.
func parseFilter(q url.Values, page bool) (Filter, error) {
	var f Filter
	var err error
	for name := range q {
		v := q.Get(name)
		switch name {
		case "tenant":
			f.Tenant = v
		case "workflow":
			f.Workflow = v
		case "status":
			f.Status = recovery.Status(v)
		case "stuck_for":
			f.StuckFor, err = time.ParseDuration(v)
		case "created_from":
			f.CreatedFrom, err = time.Parse(time.RFC3339Nano, v)
		case "created_to":
			f.CreatedTo, err = time.Parse(time.RFC3339Nano, v)
		case "newest":
			f.Newest, err = strconv.ParseBool(v)
		case "cursor":
			f.Cursor = v
		case "limit":
			if page {
				f.Limit, err = strconv.Atoi(v)
				break
			}
			fallthrough
		default:
			return f, fmt.Errorf("%w: unknown filter %q", ErrInvalidInput, name)
		}
		if err != nil {
			return f, fmt.Errorf("%w: filter %s: %v", ErrInvalidInput, name, err)
		}
	}
	return f, nil
}

// parseDeadFilter reads a dead-letter listing's query, paging (limit,
// after) only when page.
func parseDeadFilter(q url.Values, page bool) (DeadFilter, error) {
	var f DeadFilter
	var err error
	for name := range q {
		v := q.Get(name)
		switch {
		case name == "topic":
			f.Topic = v
		case name == "after":
			f.After, err = strconv.ParseInt(v, 10, 64)
		case name == "limit" && page:
			f.Limit, err = strconv.Atoi(v)
		default:
			return f, fmt.Errorf("%w: unknown filter %q", ErrInvalidInput, name)
		}
		if err != nil {
			return f, fmt.Errorf("%w: filter %s: %v", ErrInvalidInput, name, err)
		}
	}
	return f, nil
}

// decode reads the request's JSON body into v; an empty body leaves v as
// it is.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var tooBig *http.MaxBytesError
	switch {
	case err == nil, errors.Is(err, io.EOF):
		return nil
	case errors.As(err, &tooBig):
		return err
	}
	return fmt.Errorf("%w: body: %v", ErrInvalidInput, err)
}

// reply writes v as JSON, or err as a problem.
func (a *Admin) reply(w http.ResponseWriter, v any, err error) {
	if err != nil {
		a.writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v) // the client went away
}

// writeError answers err with the status that says what kind it is.
func (a *Admin) writeError(w http.ResponseWriter, err error) {
	status, detail := a.problem(err)
	writeProblem(w, status, detail)
}

// failedDetail is what an operator is shown of an error that is not one
// of the outcomes the API names: the database's text stays in the log.
const failedDetail = "the request failed; the server's log says why"

// problem is the status that answers err and the detail shown with it:
// err's text for the outcomes the API names, else failedDetail, and err
// goes to the log.
func (a *Admin) problem(err error) (int, string) {
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return http.StatusRequestEntityTooLarge, err.Error()
	case errors.Is(err, ErrInvalidInput):
		return http.StatusBadRequest, err.Error()
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrMessageNotFound):
		return http.StatusNotFound, err.Error()
	case errors.Is(err, ErrChanged), errors.Is(err, ErrFinished), errors.Is(err, ErrLeaseLive):
		return http.StatusConflict, err.Error()
	}
	a.logger.Error("admin: request failed", "error", err)
	return http.StatusInternalServerError, failedDetail
}

// writeProblem answers with an RFC 9457 problem.
func writeProblem(w http.ResponseWriter, status int, detail string) {
	p := workflow.Problem(status, detail)
	for name, values := range p.Header {
		w.Header()[name] = values
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(p.Body)
}
