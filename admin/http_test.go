package admin_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/admin"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/recovery"
)

// tokens is the tests' authenticator: a bearer token per role.
func tokens(r *http.Request) (admin.Role, error) {
	switch r.Header.Get("Authorization") {
	case "Bearer reader":
		return admin.RoleRead, nil
	case "Bearer writer":
		return admin.RoleWrite, nil
	case "Bearer nobody":
		return admin.RoleNone, nil
	case "Bearer banned":
		return admin.RoleWrite, admin.ErrForbidden
	}
	return admin.RoleNone, errors.New("no such token")
}

// server serves b's Admin over real HTTP, mounted under /ops/ as an
// application would.
func server(t *testing.T, b *bundle) *httptest.Server {
	t.Helper()
	a, err := admin.New(b.db, admin.Config{Authorize: tokens, MaxBulk: 10})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", a.Handler()))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

type call struct {
	method, path, token, body string
	header                    map[string]string
}

// do makes the call and returns the status and the body.
func do(t *testing.T, srv *httptest.Server, c call) (int, []byte) {
	t.Helper()
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	req, err := http.NewRequest(c.method, srv.URL+"/ops"+c.path, body)
	require.NoError(t, err)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range c.header {
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if resp.StatusCode >= 400 {
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"), "errors are problems: %s", out)
	}
	return resp.StatusCode, out
}

func keyPath(k recovery.Key) string {
	return "/api/keys/" + url.PathEscape(k.Tenant) + "/" + url.PathEscape(k.ID)
}

func ownerBody(rec *recovery.Record, force bool) string {
	b, _ := json.Marshal(admin.Action{Owner: rec.Owner, Force: force, Reason: "test"})
	return string(b)
}

// TestHTTPRoles: no credentials is 401, no access 403, the read-only role
// reads but may not act, the read-write role acts.
func TestHTTPRoles(t *testing.T) {
	b := setup(t, admin.Config{})
	srv := server(t, b)
	rec := b.stuck(t, key("acme", "order-1"), "checkout")
	release := call{method: "POST", path: keyPath(rec.Key) + "/release", body: ownerBody(rec, false)}

	for token, want := range map[string]int{"": 401, "forged": 401, "nobody": 403, "banned": 403, "reader": 200} {
		status, body := do(t, srv, call{method: "GET", path: "/api/keys", token: token})
		require.Equal(t, want, status, "token %q: %s", token, body)
	}
	for token, want := range map[string]int{"": 401, "nobody": 403, "banned": 403, "reader": 403} {
		c := release
		c.token = token
		status, body := do(t, srv, c)
		require.Equal(t, want, status, "token %q: %s", token, body)
		require.Equal(t, rec.Owner, b.load(t, rec.Key).Owner, "token %q changed nothing", token)
	}
	for token, want := range map[string]string{"reader": `{"role": "read"}`, "writer": `{"role": "write"}`} {
		status, body := do(t, srv, call{method: "GET", path: "/api/role", token: token})
		require.Equal(t, 200, status)
		require.JSONEq(t, want, string(body), "a page learns what its operator may do")
	}
	release.token = "writer"
	status, body := do(t, srv, release)
	require.Equal(t, 200, status, "%s", body)
	var got admin.Record
	require.NoError(t, json.Unmarshal(body, &got))
	require.True(t, got.Released)
}

// TestHTTPRefusesCrossOriginActions: a page on another origin cannot make
// an operator's browser act, whether by a form (not JSON) or by fetch
// (its Sec-Fetch-Site or Origin says so).
func TestHTTPRefusesCrossOriginActions(t *testing.T) {
	b := setup(t, admin.Config{})
	srv := server(t, b)
	rec := b.stuck(t, key("acme", "order-1"), "checkout")
	path := keyPath(rec.Key) + "/release"

	for name, c := range map[string]call{
		"cross-site fetch":   {header: map[string]string{"Sec-Fetch-Site": "cross-site"}},
		"same-site fetch":    {header: map[string]string{"Sec-Fetch-Site": "same-site"}},
		"foreign origin":     {header: map[string]string{"Origin": "https://evil.example"}},
		"form post":          {header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}},
		"text/plain post":    {header: map[string]string{"Content-Type": "text/plain"}},
		"json-looking media": {header: map[string]string{"Content-Type": "text/plain; a=application/json"}},
	} {
		c.method, c.path, c.token, c.body = "POST", path, "writer", ownerBody(rec, false)
		status, body := do(t, srv, c)
		require.Contains(t, []int{403, 415}, status, "%s: %s", name, body)
		require.Equal(t, rec.Owner, b.load(t, rec.Key).Owner, "%s changed nothing", name)
	}
	status, body := do(t, srv, call{method: "POST", path: path, token: "writer", body: ownerBody(rec, false),
		header: map[string]string{"Sec-Fetch-Site": "same-origin"}})
	require.Equal(t, 200, status, "the console's own fetch acts: %s", body)
}

// TestHTTPAPI walks the API as the console does: list, show, act, a
// conflict, bulk, and the outbox's dead letters.
func TestHTTPAPI(t *testing.T) {
	b := setup(t, admin.Config{})
	srv := server(t, b)
	odd := key("acme corp", "order/42?x=1")
	rec := b.stuck(t, odd, "checkout")
	b.stuck(t, key("acme", "order-2"), "checkout")
	b.completed(t, key("acme", "order-3"), "checkout")

	status, body := do(t, srv, call{method: "GET", path: "/api/keys?status=in_flight&limit=1", token: "reader"})
	require.Equal(t, 200, status, "%s", body)
	var page admin.Page
	require.NoError(t, json.Unmarshal(body, &page))
	require.Equal(t, []string{"acme corp/order/42?x=1"}, keys(page.Records))
	status, body = do(t, srv, call{method: "GET", path: "/api/keys?status=in_flight&cursor=" + page.Next, token: "reader"})
	require.Equal(t, 200, status, "%s", body)
	var last admin.Page
	require.NoError(t, json.Unmarshal(body, &last))
	require.Equal(t, []string{"acme/order-2"}, keys(last.Records))
	require.Empty(t, last.Next)

	for _, q := range []string{"stauts=in_flight", "status=stuck", "stuck_for=ten", "created_from=yesterday", "limit=100000"} {
		status, body = do(t, srv, call{method: "GET", path: "/api/keys?" + q, token: "reader"})
		require.Equal(t, 400, status, "%s: %s", q, body)
	}

	status, body = do(t, srv, call{method: "GET", path: keyPath(odd), token: "reader"})
	require.Equal(t, 200, status, "%s", body)
	var d admin.Detail
	require.NoError(t, json.Unmarshal(body, &d))
	require.Equal(t, rec.Owner, d.Owner)
	require.JSONEq(t, `{"order": "order/42?x=1"}`, string(d.Request))
	status, _ = do(t, srv, call{method: "GET", path: keyPath(key("acme", "nope")), token: "reader"})
	require.Equal(t, 404, status)

	status, body = do(t, srv, call{method: "POST", path: keyPath(odd) + "/release", token: "writer", body: ownerBody(rec, false)})
	require.Equal(t, 200, status, "%s", body)
	status, body = do(t, srv, call{method: "POST", path: keyPath(odd) + "/fail", token: "writer", body: ownerBody(rec, false)})
	require.Equal(t, 409, status, "the owner read is stale: %s", body)
	require.Contains(t, string(body), "changed")
	status, _ = do(t, srv, call{method: "POST", path: keyPath(odd) + "/explode", token: "writer", body: ownerBody(rec, false)})
	require.Equal(t, 404, status)
	status, _ = do(t, srv, call{method: "POST", path: keyPath(odd) + "/fail", token: "writer", body: `{"owner": "x", "bogus": 1}`})
	require.Equal(t, 400, status)
	status, _ = do(t, srv, call{method: "POST", path: keyPath(odd) + "/fail", token: "writer",
		body: `{"reason": "` + strings.Repeat("x", admin.MaxBodyBytes) + `"}`})
	require.Equal(t, 413, status)

	status, body = do(t, srv, call{method: "POST", path: "/api/bulk/fail", token: "writer",
		body: `{"filter": {"tenant": "acme", "status": "in_flight"}, "reason": "outage"}`})
	require.Equal(t, 200, status, "%s", body)
	var rep admin.Report
	require.NoError(t, json.Unmarshal(body, &rep))
	require.Equal(t, admin.Report{Matched: 1, Done: 1}, rep)
	require.Equal(t, recovery.StatusFailed, b.load(t, key("acme", "order-2")).Status)
	status, _ = do(t, srv, call{method: "POST", path: "/api/bulk/fail", token: "writer", body: `{"filter": {"stauts": "in_flight"}}`})
	require.Equal(t, 400, status, "a misspelt filter does not match everything")

	// The outbox: a dead message is listed and retried.
	ob, err := outbox.New(outbox.Config{})
	require.NoError(t, err)
	require.NoError(t, ob.Enqueue(b.ctx, b.db, outbox.Message{Topic: "receipt", DedupeKey: "r1", Payload: map[string]int{"order": 1}}))
	relay, err := outbox.NewRelay(b.db, outbox.RelayConfig{MaxAttempts: 1, Handlers: map[string]outbox.Handler{
		"receipt": func(context.Context, *outbox.Record) error { return errors.New("smtp down") }}})
	require.NoError(t, err)
	_, err = relay.RunOnce(b.ctx)
	require.NoError(t, err)
	status, body = do(t, srv, call{method: "GET", path: "/api/outbox/dead", token: "reader"})
	require.Equal(t, 200, status, "%s", body)
	var dead admin.DeadPage
	require.NoError(t, json.Unmarshal(body, &dead))
	require.Len(t, dead.Messages, 1)
	require.Equal(t, "smtp down", dead.Messages[0].LastError)
	retry := "/api/outbox/" + strconv.FormatInt(dead.Messages[0].ID, 10) + "/retry"
	status, body = do(t, srv, call{method: "POST", path: retry, token: "writer"})
	require.Equal(t, 200, status, "%s", body)
	status, _ = do(t, srv, call{method: "POST", path: "/api/outbox/999999/retry", token: "writer"})
	require.Equal(t, 404, status)
	status, _ = do(t, srv, call{method: "POST", path: "/api/outbox/x/retry", token: "writer"})
	require.Equal(t, 400, status)
	msgs, err := ob.List(b.ctx, b.db, outbox.Filter{Status: outbox.StatusPending})
	require.NoError(t, err)
	require.Len(t, msgs, 1)

	// It dies again, with another; a bulk retry of one topic revives its own.
	require.NoError(t, ob.Enqueue(b.ctx, b.db, outbox.Message{Topic: "invoice", DedupeKey: "i1", Payload: 1}))
	relay, err = outbox.NewRelay(b.db, outbox.RelayConfig{MaxAttempts: 1, Handlers: map[string]outbox.Handler{
		"receipt": func(context.Context, *outbox.Record) error { return errors.New("smtp down") },
		"invoice": func(context.Context, *outbox.Record) error { return errors.New("pdf down") }}})
	require.NoError(t, err)
	_, err = relay.RunOnce(b.ctx)
	require.NoError(t, err)
	status, body = do(t, srv, call{method: "POST", path: "/api/bulk/retry", token: "writer", body: `{"filter": {"topic": "receipt"}}`})
	require.Equal(t, 200, status, "%s", body)
	rep = admin.Report{}
	require.NoError(t, json.Unmarshal(body, &rep))
	require.Equal(t, admin.Report{Matched: 1, Done: 1}, rep)
	dead = admin.DeadPage{}
	status, body = do(t, srv, call{method: "GET", path: "/api/outbox/dead", token: "reader"})
	require.Equal(t, 200, status, "%s", body)
	require.NoError(t, json.Unmarshal(body, &dead))
	require.Len(t, dead.Messages, 1)
	require.Equal(t, "invoice", dead.Messages[0].Topic)
}

// TestNewRefusesOpenAccess: without an authenticator there is no Admin:
// no default lets anyone in.
func TestNewRefusesOpenAccess(t *testing.T) {
	t.Parallel()
	_, err := admin.New(nil, admin.Config{})
	require.ErrorIs(t, err, admin.ErrInvalidInput)
	require.Contains(t, err.Error(), "Authorize")
	_, err = admin.New(nil, admin.Config{Authorize: tokens, MaxBulk: admin.MaxBulkLimit + 1})
	require.ErrorIs(t, err, admin.ErrInvalidInput)
}

// TestHTTPRefusesTextTheDatabaseCannotHold: a filter or cursor holding a
// NUL byte or invalid UTF-8 is the operator's mistake, a 400 that says
// which field, not a query that fails as a 500 and an error in the log.
//
// Mutation caught: checkText not called by Filter.validate, decodeCursor
// or Dead (each case answers 500).
func TestHTTPRefusesTextTheDatabaseCannotHold(t *testing.T) {
	b := setup(t, admin.Config{})
	srv := server(t, b)
	b.stuck(t, key("acme", "order-1"), "checkout")
	cursor := func(tenant string) string {
		raw, err := json.Marshal(map[string]string{"u": "2026-01-01T00:00:00Z", "t": tenant, "k": "order-1"})
		require.NoError(t, err)
		return base64.RawURLEncoding.EncodeToString(raw)
	}
	for _, path := range []string{
		"/api/keys?tenant=a%00b",
		"/api/keys?tenant=%FF",
		"/api/keys?workflow=%00",
		"/api/keys?cursor=" + cursor("a\x00b"),
		"/api/outbox/dead?topic=%00",
	} {
		status, body := do(t, srv, call{method: "GET", path: path, token: "reader"})
		require.Equal(t, 400, status, "%s: %s", path, body)
	}
	status, body := do(t, srv, call{method: "POST", path: "/api/bulk/release", token: "writer", body: `{"filter": {"tenant": "a\u0000"}}`})
	require.Equal(t, 400, status, "%s", body)
	status, body = do(t, srv, call{method: "GET", path: "/api/keys?cursor=" + cursor("acme"), token: "reader"})
	require.Equal(t, 200, status, "a cursor of printable text still pages: %s", body)
}

// TestHTTPBulkReportKeepsTheDatabasesErrorsInTheLog: a record the
// database refuses to write (here a trigger raises) is counted among a
// bulk action's errors without the database's text, as the single
// action's 500 is; the log gets the text.
//
// Mutation caught: the report's reason set to err.Error() for every error
// (the trigger's message reaches the operator and the log has nothing).
func TestHTTPBulkReportKeepsTheDatabasesErrorsInTheLog(t *testing.T) {
	b := setup(t, admin.Config{})
	rec := b.stuck(t, key("boom", "order-1"), "checkout")
	var log lockedLog
	a, err := admin.New(b.db, admin.Config{Authorize: tokens, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	require.NoError(t, err)
	srv := httptest.NewServer(http.StripPrefix("/ops", a.Handler()))
	t.Cleanup(srv.Close)
	_, err = b.db.Exec(b.ctx, `
		CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.tenant_id = 'boom' THEN RAISE EXCEPTION 'internal detail of table onceflow_keys'; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_boom BEFORE UPDATE ON onceflow_keys FOR EACH ROW EXECUTE FUNCTION refuse_boom()`)
	require.NoError(t, err)

	status, body := do(t, srv, call{method: "POST", path: keyPath(rec.Key) + "/release", token: "writer", body: ownerBody(rec, false)})
	require.Equal(t, 500, status)
	require.NotContains(t, string(body), "internal detail")
	status, body = do(t, srv, call{method: "POST", path: "/api/bulk/release", token: "writer", body: `{"filter": {"tenant": "boom"}}`})
	require.Equal(t, 200, status, "%s", body)
	var rep admin.Report
	require.NoError(t, json.Unmarshal(body, &rep))
	require.Len(t, rep.Errors, 1, "%s", body)
	require.Equal(t, "order-1", rep.Errors[0].Key)
	require.NotContains(t, string(body), "internal detail", "the report shows what the single action's 500 shows")
	require.Equal(t, 2, strings.Count(log.String(), "internal detail"), "the log gets both: %s", log.String())
}

// lockedLog is a log a server's goroutines write while the test reads it.
type lockedLog struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
