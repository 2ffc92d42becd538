package idemhttp_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// The attack suite: each test is one way an attacker got at a response or a
// resource that was not theirs, or held a server's resources, against a
// real server and a real PostgreSQL, as issue 12 found them.

// tokens are the test servers' credentials: a bearer token names a tenant
// and a user in it.
var tokens = map[string]struct{ tenant, user string }{
	"tok-alice": {"acme", "alice"},
	"tok-bob":   {"acme", "bob"},
	"tok-eve":   {"globex", "eve"},
}

// byToken authenticates a request by its bearer token, as an application
// would: the tenant (or user) is the token's, whatever else the request says.
func byToken(user bool) func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		who, ok := tokens[token]
		switch {
		case !ok:
			return "", errors.New("unknown token")
		case user:
			return who.user, nil
		}
		return who.tenant, nil
	}
}

// send sends one request with the given headers (values added in order).
func (s *server) send(method, path string, header http.Header, body string) reply {
	s.t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	require.NoError(s.t, err)
	for name, values := range header {
		for _, v := range values {
			req.Header.Add(name, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// as is the headers of a JSON request with key, sent with token.
func as(token, key string) http.Header {
	h := http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {key}}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	return h
}

// TestAttackForgedTenantHeaderIsIgnored: the tenant is what authentication
// says. A Config without Tenant is refused, and a server that takes the
// tenant from the token gives an attacker who names another tenant in
// X-Tenant-ID its own record, never that tenant's stored response.
func TestAttackForgedTenantHeaderIsIgnored(t *testing.T) {
	_, err := idemhttp.Middleware(dbtest.NewPool(t, 1), idemhttp.Config{})
	require.ErrorIs(t, err, idemhttp.ErrNoTenant, "no tenant is read from a header by default")

	s := newServer(t, idemhttp.Config{Tenant: byToken(false)})
	body := `{"amount": 100}`
	victim := s.send("POST", "/v1/charges", as("tok-alice", "k1"), body)
	require.Equal(t, http.StatusCreated, victim.status)

	forged := as("tok-eve", "k1")
	forged.Set("X-Tenant-ID", "acme")
	attack := s.send("POST", "/v1/charges", forged, body)
	require.Equal(t, http.StatusCreated, attack.status)
	require.Empty(t, attack.header.Get(idemhttp.ReplayedHeader), "the attacker got no replay")
	require.NotEqual(t, victim.body, attack.body)

	anonymous := s.send("POST", "/v1/charges", http.Header{"Idempotency-Key": {"k1"}, "X-Tenant-ID": {"acme"}}, body)
	require.Equal(t, http.StatusUnauthorized, anonymous.status)
	require.NotContains(t, anonymous.body, victim.body)
	require.EqualValues(t, 2, s.runs.Load())
}

// TestAttackRepeatedTenantHeaderIsRefused: behind a proxy that appends its
// own X-Tenant-ID to the client's, the client's copy came first and won.
// A trusted header sent twice, or joined with a comma, is 400.
func TestAttackRepeatedTenantHeaderIsRefused(t *testing.T) {
	s := newServer(t, idemhttp.Config{Tenant: idemhttp.TenantFromTrustedHeader("X-Tenant-ID")})
	for name, tenant := range map[string][]string{
		"repeated":    {"acme", "globex"},
		"comma":       {"acme, globex"},
		"bare comma":  {"acme,globex"},
		"empty first": {",globex"},
	} {
		h := as("", "k-"+name)
		h["X-Tenant-Id"] = tenant
		r := s.send("POST", "/v1/charges", h, `{}`)
		require.Equal(t, http.StatusBadRequest, r.status, name)
		problemOf(t, r)
	}
	require.Zero(t, s.runs.Load())
}

// TestAttackReplayToAnotherPrincipal: alice creates an API secret; bob, of
// the same tenant, and an anonymous caller send her key and body. A replay
// skips the handler's own checks, so the middleware refuses them: 403 for
// another principal, whether the record is in flight or completed, with
// the same answer each time, and 401 for no credentials; none of them
// learns the secret or runs anything.
func TestAttackReplayToAnotherPrincipal(t *testing.T) {
	principal := func(r *http.Request) (string, error) {
		if r.Header.Get("Authorization") == "" {
			return "anonymous", nil // a route open to anonymous callers
		}
		return byToken(true)(r)
	}
	s := newServer(t, idemhttp.Config{Tenant: func(*http.Request) (string, error) { return "acme", nil }, Principal: principal})
	entered, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // before the server closes
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		fmt.Fprint(w, `{"api_secret":"sk_live_`+uuid.NewString()+`"}`)
	}
	body := `{"name":"ci"}`
	done := make(chan reply, 1)
	go func() { done <- s.send("POST", "/v1/charges", as("tok-alice", "k1"), body) }()
	<-entered

	refusals := func() []reply {
		var out []reply
		for _, token := range []string{"tok-bob", ""} {
			r := s.send("POST", "/v1/charges", as(token, "k1"), body)
			require.Equal(t, http.StatusForbidden, r.status, "token %q: %s", token, r.body)
			out = append(out, r)
		}
		return out
	}
	inFlight := refusals()
	releaseOnce.Do(func() { close(release) })
	created := <-done
	require.Equal(t, http.StatusOK, created.status)
	completed := refusals()
	for i := range completed {
		require.Equal(t, inFlight[i].body, completed[i].body, "the refusal says nothing of the record's state")
		require.Empty(t, completed[i].header.Get("Retry-After"))
		require.NotContains(t, completed[i].body, "sk_live_")
	}
	unknown := s.send("POST", "/v1/charges", as("tok-forged", "k1"), body)
	require.Equal(t, http.StatusUnauthorized, unknown.status)
	require.NotContains(t, unknown.body, "sk_live_")
	require.EqualValues(t, 1, s.runs.Load(), "no refused request ran")

	replay := s.send("POST", "/v1/charges", as("tok-alice", "k1"), body)
	require.Equal(t, created.body, replay.body, "alice still gets her replay")
}

// TestAttackReplayToAnotherPrincipalOfAWorkflow: the same through Workflow
// and the engine.
func TestAttackReplayToAnotherPrincipalOfAWorkflow(t *testing.T) {
	s := newWorkflowServerWith(t, idemhttp.WorkflowConfig{Tenant: byToken(false), Principal: byToken(true)})
	first := s.send("POST", "/v1/charges", as("tok-alice", "k1"), `{"amount_cents": 500}`)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	other := s.send("POST", "/v1/charges", as("tok-bob", "k1"), `{"amount_cents": 500}`)
	require.Equal(t, http.StatusForbidden, other.status, other.body)
	require.NotContains(t, other.body, "charge")
	require.EqualValues(t, 1, s.runs.Load())
}

// TestAttackStoredRefusalIsNotReplayed: a 401 answered before the caller
// logged in, or a 429 before a rate limit passed, was stored and replayed
// for the key's whole retention. Temporary refusals are answered but not
// stored: the retry runs the handler.
func TestAttackStoredRefusalIsNotReplayed(t *testing.T) {
	s := newServer(t, idemhttp.Config{Tenant: func(*http.Request) (string, error) { return "acme", nil }})
	for _, refusal := range []int{http.StatusUnauthorized, http.StatusTooManyRequests} {
		key := fmt.Sprintf("k%d", refusal)
		s.handle = func(w http.ResponseWriter, r *http.Request) {
			tx, err := idemhttp.Tx(r.Context())
			require.NoError(t, err)
			_, err = tx.Exec(r.Context(), `INSERT INTO charges (body) VALUES ('refused')`)
			require.NoError(t, err)
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(refusal)
		}
		first := s.post("/v1/charges", key, "", `{}`)
		require.Equal(t, refusal, first.status)
		require.Equal(t, "1", first.header.Get("Retry-After"))
		s.handle = s.charge
		retry := s.post("/v1/charges", key, "", `{}`)
		require.Equal(t, http.StatusCreated, retry.status, "the retry ran the handler")
		require.Empty(t, retry.header.Get(idemhttp.ReplayedHeader))
	}
	require.EqualValues(t, 4, s.runs.Load())
	require.Equal(t, 2, s.rows(), "the refusals' writes rolled back")
}

// TestReplayKeepsHowToTreatTheResponse: a replay keeps the headers that
// say how to treat the response (caching, download, sniffing, CSP) by
// default, and never a cookie, even one a configuration lists.
func TestReplayKeepsHowToTreatTheResponse(t *testing.T) {
	s := newServer(t, idemhttp.Config{ResponseHeaders: append(slices.Clone(recovery.DefaultResponseHeaders), "Set-Cookie")})
	kept := map[string]string{"Retry-After": "5", "Cache-Control": "no-store", "Content-Disposition": "attachment",
		"X-Content-Type-Options": "nosniff", "Vary": "Authorization", "Content-Security-Policy": "default-src 'none'"}
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		for name, v := range kept {
			w.Header().Set(name, v)
		}
		w.Header().Set("Set-Cookie", "session=alice")
		w.WriteHeader(http.StatusAccepted)
	}
	require.Equal(t, http.StatusAccepted, s.post("/v1/charges", "k1", "acme", `{}`).status)
	replay := s.post("/v1/charges", "k1", "acme", `{}`)
	require.Equal(t, "true", replay.header.Get(idemhttp.ReplayedHeader))
	for name, v := range kept {
		require.Equal(t, v, replay.header.Get(name), name)
	}
	require.Empty(t, replay.header.Values("Set-Cookie"))
}

// TestAttackMediaTypeConfusion: a text/plain body that parses as JSON was
// canonicalized and matched a different request. The media type is part of
// the fingerprint, and only a JSON media type is canonicalized.
func TestAttackMediaTypeConfusion(t *testing.T) {
	s := newServer(t, idemhttp.Config{})
	send := func(contentType, body string) reply {
		h := http.Header{"Idempotency-Key": {"k1"}, "X-Tenant-Id": {"acme"}, "Content-Type": {contentType}}
		return s.send("POST", "/v1/charges", h, body)
	}
	require.Equal(t, http.StatusCreated, send("text/plain", `{"to":"alice","amount":1}`).status)
	for _, c := range []struct{ contentType, body string }{
		{"text/plain", `{"amount":1,"to":"alice"}`},       // the same JSON, another text
		{"text/plain", `{"to":"alice", "amount":1}`},      // white space is text too
		{"application/json", `{"to":"alice","amount":1}`}, // the same bytes, another type
		{"text/csv", `{"to":"alice","amount":1}`},
	} {
		r := send(c.contentType, c.body)
		require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s %s", c.contentType, c.body)
	}
	again := send("Text/Plain", `{"to":"alice","amount":1}`)
	require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader), "the media type's case does not matter")

	h := http.Header{"Idempotency-Key": {"k2"}, "X-Tenant-Id": {"acme"}, "Content-Type": {"application/merge-patch+json"}}
	require.Equal(t, http.StatusCreated, s.send("POST", "/v1/charges", h, `{"a":1,"b":2}`).status)
	replay := s.send("POST", "/v1/charges", h, `{ "b": 2, "a": 1e0 }`)
	require.Equal(t, "true", replay.header.Get(idemhttp.ReplayedHeader), "a +json type is canonicalized")
	require.EqualValues(t, 2, s.runs.Load())
}

// TestAttackCaseVariantFields: encoding/json matched "Amount_Cents" to
// amount_cents, so a request holding both was read as one the sender may
// not have meant. Workflow matches names exactly: a case variant is an
// unknown field, 400, and nothing runs.
func TestAttackCaseVariantFields(t *testing.T) {
	s := newWorkflowServer(t)
	for i, body := range []string{
		`{"amount_cents": 100, "Amount_Cents": 100000}`,
		`{"Amount_Cents": 100}`,
		`{"AMOUNT_CENTS": 100}`,
	} {
		r := s.post("/v1/charges", fmt.Sprintf("k%d", i), "acme", body)
		require.Equal(t, http.StatusBadRequest, r.status, body)
		require.Contains(t, problemOf(t, r), "unknown field", body)
	}
	require.Zero(t, s.runs.Load())
}

// TestAttackCaseVariantFieldsInTheMiddleware: {"amount":100,"AMOUNT":1}
// and {"AMOUNT":1,"amount":100} have one canonical form, but encoding/json,
// which sets a field from the last member whose name matches it without
// regard to case, reads 1 from the first and 100 from the second: the
// second got the first's replay. A JSON body with two names that
// encoding/json reads as one, in any object, is fingerprinted byte for
// byte, as a body with a name given twice is: the same bytes replay, other
// bytes are another request (422). A body without them is canonicalized
// as before.
//
// Mutation caught: case variants canonicalized (case-variants-canonicalized).
func TestAttackCaseVariantFieldsInTheMiddleware(t *testing.T) {
	s := newServer(t, idemhttp.Config{})
	for i, c := range []struct{ first, reordered string }{
		{`{"amount":100,"AMOUNT":1}`, `{"AMOUNT":1,"amount":100}`},
		{`{"to":"bob","charge":{"Amount":1,"amount":100}}`, `{"charge":{"amount":100,"Amount":1},"to":"bob"}`},
		{`[{"\u212a":1,"k":2}]`, `[{"k":2,"\u212a":1}]`},       // the Kelvin sign folds to k
		{`{"\ud800":1,"\udc00":2}`, `{"\udc00":2,"\ud800":1}`}, // both U+FFFD to encoding/json
	} {
		key := fmt.Sprintf("k%d", i)
		require.Equal(t, http.StatusCreated, s.post("/v1/charges", key, "acme", c.first).status, c.first)
		again := s.post("/v1/charges", key, "acme", c.first)
		require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader), "the same bytes replay: %s", c.first)
		reordered := s.post("/v1/charges", key, "acme", c.reordered)
		require.Equal(t, http.StatusUnprocessableEntity, reordered.status, "%s after %s: %s", c.reordered, c.first, reordered.body)
	}
	require.EqualValues(t, 4, s.runs.Load())

	require.Equal(t, http.StatusCreated, s.post("/v1/charges", "plain", "acme", `{"amount":100,"Currency":"usd"}`).status)
	respelled := s.post("/v1/charges", "plain", "acme", ` { "Currency" : "usd", "amount" : 1e2 } `)
	require.Equal(t, "true", respelled.header.Get(idemhttp.ReplayedHeader), "distinct names: canonicalized")
}

// TestAttackMergedKeyList: two Idempotency-Key values merged into one
// header by a proxy ("a";x, "b") were read as the first key, its
// parameters ignored along with everything after them. The parameters are
// parsed by the RFC 8941 grammar and anything after them is 400.
func TestAttackMergedKeyList(t *testing.T) {
	s := newServer(t, idemhttp.Config{})
	for _, key := range []string{`"a";x, "b"`, `"a";x=1,"b"`, `"a";x="y" "b"`, `"a";x=?1;`, `"a";Y`, `"a";x=1.2345`} {
		r := s.post("/v1/charges", key, "acme", `{}`)
		require.Equal(t, http.StatusBadRequest, r.status, key)
		problemOf(t, r)
	}
	require.Zero(t, s.runs.Load())
	require.Equal(t, http.StatusCreated, s.post("/v1/charges", `"a";x;y=?0`, "acme", `{}`).status)
}

// rawRequest opens a connection to s and writes head, a request's head.
func rawRequest(t *testing.T, s *server, head string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	_, err = io.WriteString(conn, strings.ReplaceAll(head, "\n", "\r\n"))
	require.NoError(t, err)
	return conn, bufio.NewReader(conn)
}

// TestAttackSlowBodyIsCutOff: a client that sends a body slowly held its
// connection and a buffer for as long as it liked. The body read is
// bounded in time: 408, and the connection is closed.
func TestAttackSlowBodyIsCutOff(t *testing.T) {
	const bound = 300 * time.Millisecond
	s := newServer(t, idemhttp.Config{BodyTimeout: bound})
	conn, in := rawRequest(t, s, "POST /v1/charges HTTP/1.1\nHost: x\nIdempotency-Key: k1\nX-Tenant-ID: acme\n"+
		"Content-Type: application/json\nContent-Length: 100\n\n{\"amount\":")
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(20*bound)))
	resp, err := http.ReadResponse(in, nil)
	require.NoError(t, err, "the server answered within the bound (with a margin of many times it)")
	defer resp.Body.Close()
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	require.True(t, resp.Close, "the connection is closed")
	require.Zero(t, s.runs.Load())
}

// TestAttackOversizedBodyBefore100Continue: a client that asks before
// sending a body too large got "100 Continue", then sent it. It is 413 at
// once, and the body is never asked for.
func TestAttackOversizedBodyBefore100Continue(t *testing.T) {
	s := newServer(t, idemhttp.Config{MaxBody: 1024})
	_, in := rawRequest(t, s, "POST /v1/charges HTTP/1.1\nHost: x\nIdempotency-Key: k1\nX-Tenant-ID: acme\n"+
		"Content-Type: application/json\nContent-Length: 1025\nExpect: 100-continue\n\n")
	status, err := in.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 413 Request Entity Too Large\r\n", status, "no 100 Continue came first")
	require.Zero(t, s.runs.Load())
}

// TestAttackResponseOverMaxResponse: every response was stored whatever
// its size. One over MaxResponse is not stored (logged, and a retry runs
// the handler again); the client still gets it, or, when the handler wrote
// in Tx, a 500 and its writes roll back.
func TestAttackResponseOverMaxResponse(t *testing.T) {
	var logs syncBuffer
	s := newServer(t, idemhttp.Config{MaxResponse: 1024, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	big := strings.Repeat("x", 4096)
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		for i := 0; i < len(big); i += 512 {
			_, err := io.WriteString(w, big[i:i+512])
			require.NoError(t, err)
		}
	}
	for range 2 {
		r := s.post("/v1/charges", "k1", "acme", `{}`)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, big, r.body, "the client got the whole response")
		require.Empty(t, r.header.Get(idemhttp.ReplayedHeader))
	}
	require.EqualValues(t, 2, s.runs.Load(), "nothing was stored: the retry ran the handler")
	require.Contains(t, logs.String(), "larger than MaxResponse")

	s.handle = func(w http.ResponseWriter, r *http.Request) {
		tx, err := idemhttp.Tx(r.Context())
		require.NoError(t, err)
		_, err = tx.Exec(r.Context(), `INSERT INTO charges (body) VALUES ('big')`)
		require.NoError(t, err)
		_, err = io.WriteString(w, big)
		require.Error(t, err, "the handler learns its response will not be sent")
	}
	r := s.post("/v1/charges", "k2", "acme", `{}`)
	require.Equal(t, http.StatusInternalServerError, r.status)
	problemOf(t, r)
	require.Zero(t, s.rows(), "the writes the response would have reported rolled back")
	var keys int
	require.NoError(t, s.db.QueryRow(context.Background(), `SELECT count(*) FROM onceflow_keys`).Scan(&keys))
	require.Zero(t, keys)
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// operations records the operation names an Observer hears.
type operations struct {
	workflow.NopObserver
	mu    sync.Mutex
	names map[string]bool
}

func (o *operations) Claimed(workflow, _ string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.names[workflow] = true
}

// TestAttackRandomPathsMakeOneOperation: where no route pattern matched,
// the operation was the raw path, so 500 random paths made 500 metric
// series and 500 stored operation names. They are one name now, and so
// are random methods on a pattern without one; the fingerprint still
// tells the paths apart.
func TestAttackRandomPathsMakeOneOperation(t *testing.T) {
	t.Parallel()
	db := dbtest.NewPool(t, 4)
	seen := &operations{names: map[string]bool{}}
	mw, err := idemhttp.Middleware(db, idemhttp.Config{Tenant: trustedTenant, Observer: seen})
	require.NoError(t, err)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, r.URL.Path) })
	mux := http.NewServeMux()
	mux.Handle("/v1/any", mw(ok))
	srv := httptest.NewServer(http.NewServeMux())
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/any" {
			mux.ServeHTTP(w, r)
			return
		}
		mw(ok).ServeHTTP(w, r) // the middleware in front of any routing
	})
	t.Cleanup(srv.Close)
	s := &server{t: t, db: db, url: srv.URL}
	for i := range 50 {
		r := s.post("/"+uuid.NewString(), fmt.Sprintf("k%d", i), "acme", `{}`)
		require.Equal(t, http.StatusOK, r.status, r.body)
		r = s.send(fmt.Sprintf("M%d", i), "/v1/any", http.Header{"Idempotency-Key": {fmt.Sprintf("m%d", i)}, "X-Tenant-Id": {"acme"}}, "")
		require.Equal(t, http.StatusOK, r.status, r.body)
	}
	require.Equal(t, map[string]bool{idemhttp.UnmatchedOperation: true, "OTHER /v1/any": true}, seen.names)
	var names int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(DISTINCT workflow) FROM onceflow_keys`).Scan(&names))
	require.Equal(t, 2, names)

	mismatch := s.post("/"+uuid.NewString(), "k0", "acme", `{}`)
	require.Equal(t, http.StatusUnprocessableEntity, mismatch.status, "another path under one name is another request")
}
