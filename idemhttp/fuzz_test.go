package idemhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/jsontest"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// The fuzz targets here drive a real server and a real PostgreSQL. Each
// fuzzing process makes one database and empties its tables before every
// input, so that an input's outcome depends on the input alone. Run one
// longer with:
//
//	go test ./idemhttp -run '^$' -fuzz '^FuzzMiddleware$' -fuzztime 1m
//	go test ./idemhttp -run '^$' -fuzz '^FuzzWorkflowHandler$' -fuzztime 1m

// fuzzMaxBody is the fuzzed middleware's body limit: small, so that
// padding crosses it cheaply.
const fuzzMaxBody = 4 << 10

// fuzzAnswers are the statuses the fuzzed handler answers with, picked by
// an input byte: stored ones and, from 500 up, ones that are not.
var fuzzAnswers = []int{200, 201, 202, 204, 302, 400, 404, 409, 418, 422, 500, 502, 503, 401, 429}

// Bits of FuzzMiddleware's flags.
const (
	fuzzSendKey    = 1 << iota // send the Idempotency-Key header
	fuzzSendTenant             // send the X-Tenant-ID header
	fuzzTwoKeys                // send the Idempotency-Key header twice
	fuzzDirect                 // call ServeHTTP instead of going over the wire
)

// FuzzMiddleware sends a request with any key, tenant, method, path and
// body through Middleware, and checks the answer against what the
// documentation promises, worked out from the input alone:
//   - no key, two keys, or a key that is empty, longer than 255 bytes,
//     unprintable or badly quoted: 400;
//   - otherwise no tenant: 401, a tenant that holds a comma or breaks the
//     input rules: 400;
//   - otherwise a body over the limit: 413;
//   - otherwise the handler's own answer, stored and replayed byte for
//     byte (with Idempotent-Replayed) unless StoreDefault refuses it.
//
// Every refusal is problem+json, runs no handler and stores nothing. A
// request a client can send goes over a real connection; one it cannot
// (NUL or a newline in a header, a method that is not a token) is given to
// ServeHTTP directly, as a server in front might.
func FuzzMiddleware(f *testing.F) {
	long := strings.Repeat("k", 255)
	for _, s := range []struct {
		key, tenant, method, path, body string
		pad                             uint16
		flags                           uint8
		answer                          uint8
	}{
		{key: "k1", tenant: "acme", method: "POST", path: "v1/charges", body: `{"amount": 100}`, answer: 1},
		{key: `"k1"`, tenant: "acme", method: "POST", path: "v1/charges", body: `{"amount":1e2}`, answer: 1},
		{key: `"a \"quoted\" \\ key";v=2`, tenant: "acme", method: "PUT", path: "v1/x"},
		{key: long, tenant: "acme", method: "POST", body: "not json"},
		{key: long + "k", tenant: "acme", method: "POST"},
		{key: `"` + long + `k"`, tenant: "acme", method: "POST"},
		{key: "", tenant: "acme", method: "POST"},
		{key: `""`, tenant: "acme", method: "POST"},
		{key: `""`, method: "POST", flags: fuzzSendTenant},       // an empty key, no tenant
		{key: long + "k", method: "POST", flags: fuzzSendTenant}, // a long key, no tenant
		{key: "a b", method: "POST", flags: fuzzSendTenant},      // a bad key, no tenant
		{key: "k1", tenant: "acme", method: "POST", flags: fuzzTwoKeys},
		{key: "a b", tenant: "acme", method: "POST"},
		{key: "a,b", tenant: "acme", method: "POST"},
		{key: "a\tb", tenant: "acme", method: "POST"},
		{key: "a\x00b", tenant: "acme", method: "POST"},
		{key: "a\r\nX-Tenant-ID: evil", tenant: "acme", method: "POST"},
		{key: "\xff\xfe", tenant: "acme", method: "POST"},
		{key: "ключ", tenant: "acme", method: "POST"},
		{key: "\u00a0k1\u3000", tenant: "acme", method: "POST"},
		{key: `abc"`, tenant: "acme", method: "POST"},
		{key: `"a\b"`, tenant: "acme", method: "POST"},
		{key: `"ab`, tenant: "acme", method: "POST"},
		{key: `"ab"x`, tenant: "acme", method: "POST"},
		{key: `"a";x, "b"`, tenant: "acme", method: "POST"},
		{key: `"a";X=1`, tenant: "acme", method: "POST"},
		{key: `"a";x=1.2345`, tenant: "acme", method: "POST"},
		{key: `"a";  x=?1;y="z";w=:YQ==:;v=t/k`, tenant: "acme", method: "POST", answer: 1},
		{key: "k1", tenant: "acme, evil", method: "POST"},
		{key: "k1", tenant: "acme", method: "POST", answer: 13},
		{key: "k1", tenant: "acme", method: "POST", answer: 14},
		{key: "\"a\x7fb\"", tenant: "acme", method: "POST"},
		{key: " \t k1 \t", tenant: " acme ", method: "POST", answer: 1},
		{key: "k1", tenant: "", method: "POST"}, // sent empty
		{key: "k1", tenant: " \t ", method: "POST"},
		{key: "k1", tenant: "\x00", method: "POST"},
		{key: "k1", tenant: "\xffacme", method: "POST"},
		{key: "k1", tenant: "ac\u200bme", method: "POST"},
		{key: "k1", tenant: "\u00a0acme", method: "POST"},
		{key: "k1", tenant: strings.Repeat("t", 256), method: "POST"},
		{key: "k1", tenant: "société générale", method: "POST", answer: 1},
		{key: "k1", tenant: "acme", method: "POST", body: "{}", pad: fuzzMaxBody - 2},
		{key: "k1", tenant: "acme", method: "POST", body: "{}", pad: fuzzMaxBody - 1},
		{key: "k1", tenant: "acme", method: "POST", pad: 60000},
		{key: "k1", tenant: "acme", method: "POST", body: "\x00\xff\xfe{\"a\":\"\\u0000\"}"},
		{key: "k1", tenant: "acme", method: "POST", body: strings.Repeat("[", 3000) + strings.Repeat("]", 3000)},
		{key: "k1", tenant: "acme", method: "POST", body: `{"a":1,"a":2}`},
		{key: "k1", tenant: "acme", method: "GET", path: "v1/charges/1"},
		{key: "k1", tenant: "acme", method: "DELETE", path: "v1/charges/1", answer: 3},
		{key: "k1", tenant: "acme", method: "BREW", path: "pot", answer: 8},
		{key: "k1", tenant: "acme", method: "HEAD", path: "v1"},
		{key: "k1", tenant: "acme", method: "", path: "v1"},
		{key: "k1", tenant: "acme", method: "PO ST", path: "v1"},
		{key: "k1", tenant: "acme", method: strings.Repeat("M", 300), path: "v1"},
		{key: "k1", tenant: "acme", method: "POST", path: strings.Repeat("p", 300)},
		{key: "k1", tenant: "acme", method: "POST", path: "a\x00b/%2F/\xff/ü/../?#"},
		{key: "k1", tenant: "acme", method: "POST", path: "v1/charges", answer: 10},
		{key: "k1", tenant: "acme", method: "POST", path: "v1/charges", answer: 12},
		{key: "k1", tenant: "acme", method: "POST", path: "v1/charges", answer: 4, flags: fuzzDirect},
		{key: "k1", tenant: "acme", method: "POST", flags: fuzzSendKey},                  // no key
		{key: "k1", tenant: "acme", method: "POST", flags: fuzzSendTenant},               // no tenant
		{key: "k1", tenant: "acme", method: "POST", flags: fuzzSendKey | fuzzSendTenant}, // neither
	} {
		// A seed's flags toggle the default: both headers sent.
		flags := s.flags ^ (fuzzSendKey | fuzzSendTenant)
		f.Add(s.key, s.tenant, s.method, s.path, []byte(s.body), s.pad, flags, s.answer)
	}

	rig := newMiddlewareRig(f)
	f.Fuzz(func(t *testing.T, key, tenant, method, path string, body []byte, pad uint16, flags, answer uint8) {
		in := middlewareInput{key: key, tenant: tenant, method: method, path: "/" + path,
			body: slices.Concat(body, bytes.Repeat([]byte(" "), int(pad))), flags: flags,
			answer: fuzzAnswers[int(answer)%len(fuzzAnswers)]}
		rig.reset(t)
		rig.check(t, in)
	})
}

// middlewareInput is one fuzzed request.
type middlewareInput struct {
	key, tenant, method, path string
	body                      []byte
	flags                     uint8
	answer                    int // what the handler answers
}

func (in middlewareInput) String() string {
	return fmt.Sprintf("key %q, tenant %q, method %q, path %q, %d-byte body %.64q, flags %04b, answer %d",
		in.key, in.tenant, in.method, in.path, len(in.body), in.body, in.flags, in.answer)
}

func (in middlewareInput) header() http.Header {
	h := http.Header{}
	if in.flags&fuzzSendKey != 0 {
		h.Add(idemhttp.Header, in.key)
		if in.flags&fuzzTwoKeys != 0 {
			h.Add(idemhttp.Header, in.key)
		}
	}
	if in.flags&fuzzSendTenant != 0 {
		h.Set("X-Tenant-ID", in.tenant)
	}
	return h
}

// overWire says whether a client can send the request as it is.
func (in middlewareInput) overWire() bool {
	return in.flags&fuzzDirect == 0 && isToken(in.method) && in.method != http.MethodHead &&
		in.method != http.MethodConnect && isFieldValue(in.key) && isFieldValue(in.tenant)
}

// expectMiddleware is what the documentation says the middleware answers
// to in: a problem's status, or 0 where the handler runs.
func expectMiddleware(in middlewareInput) int {
	if in.flags&fuzzSendKey == 0 || in.flags&fuzzTwoKeys != 0 {
		return http.StatusBadRequest
	}
	id, ok := keyFromHeader(in.key)
	if !ok || id == "" || len(id) > recovery.MaxKeyLength {
		return http.StatusBadRequest
	}
	tenant := ""
	if in.flags&fuzzSendTenant != 0 {
		tenant = strings.Trim(in.tenant, " \t")
	}
	switch {
	case tenant == "":
		return http.StatusUnauthorized
	case strings.Contains(tenant, ","), !isName(tenant):
		return http.StatusBadRequest
	case len(in.body) > fuzzMaxBody:
		return http.StatusRequestEntityTooLarge
	}
	return 0
}

var (
	// bareKey is a key sent as a token: visible ASCII but for `",;\`.
	bareKey = regexp.MustCompile(`^[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*$`)
	// quotedKey is a key sent as an RFC 8941 sf-string, parameters after it
	// (section 3.1.2) and nothing else.
	quotedKey = regexp.MustCompile(`^"(` + sfString + `)"(?:;\x20*[a-z*][a-z0-9_.*-]*(?:=(?:` +
		`-?(?:[0-9]{1,15}|[0-9]{1,12}\.[0-9]{1,3})|"` + sfString + `"|[A-Za-z*][!#$%&'*+\-.^_\x60|~0-9A-Za-z:/]*|:[A-Za-z0-9+/=]*:|\?[01]))?)*$`)
	sfString    = `(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*`
	unescapeKey = strings.NewReplacer(`\"`, `"`, `\\`, `\`)
)

// keyFromHeader reads an Idempotency-Key header value as the documentation
// describes it; the spaces and tabs around a field value are not part of
// it (RFC 9110, section 5.5).
func keyFromHeader(value string) (string, bool) {
	value = strings.Trim(value, " \t")
	if m := quotedKey.FindStringSubmatch(value); m != nil {
		return unescapeKey.Replace(m[1]), true
	}
	return value, bareKey.MatchString(value)
}

// isName applies the documented input rules: required, at most 255 bytes,
// valid UTF-8, and only letters, marks, numbers, punctuation, symbols and
// the ASCII space.
func isName(s string) bool {
	if s == "" || len(s) > recovery.MaxKeyLength || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r != ' ' && !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S) {
			return false
		}
	}
	return true
}

// isToken reports an HTTP method a client sends: one token (RFC 9110).
func isToken(s string) bool {
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}

// isFieldValue reports a header value a client sends: no control
// characters but the tab.
func isFieldValue(s string) bool {
	for _, c := range []byte(s) {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// middlewareRig is a real server with Middleware in front of a handler that
// writes a row through Tx; there is one per fuzzing process.
type middlewareRig struct {
	db      *pgxpool.Pool
	handler http.Handler // the middleware and the handler, for ServeHTTP
	url     string
	client  *http.Client
	current atomic.Pointer[middlewareInput] // the request being sent
	runs    atomic.Int32                    // handler runs for the current input
	wrong   atomic.Pointer[string]          // what the handler found wrong
}

func newMiddlewareRig(f *testing.F) *middlewareRig {
	rig := &middlewareRig{db: dbtest.NewPool(f, 4)}
	_, err := rig.db.Exec(context.Background(), `CREATE TABLE fuzz_effects (id bigserial PRIMARY KEY)`)
	require.NoError(f, err)
	mw, err := idemhttp.Middleware(rig.db, idemhttp.Config{Tenant: trustedTenant, MaxBody: fuzzMaxBody})
	require.NoError(f, err)
	rig.handler = mw(http.HandlerFunc(rig.handle))
	srv := httptest.NewServer(rig.handler)
	f.Cleanup(srv.Close)
	rig.url, rig.client = srv.URL, srv.Client()
	rig.client.CheckRedirect = func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse // a redirect is an answer to check, not to follow
	}
	return rig
}

// handle checks that it got the whole body, writes a row in the
// middleware's transaction and answers as the input says.
func (rig *middlewareRig) handle(w http.ResponseWriter, r *http.Request) {
	run := rig.runs.Add(1)
	in := rig.current.Load()
	body, err := io.ReadAll(r.Body)
	if err == nil && !bytes.Equal(body, in.body) {
		err = fmt.Errorf("the handler got %d bytes of the %d sent", len(body), len(in.body))
	}
	if err == nil {
		err = rig.effect(r.Context())
	}
	if err != nil {
		msg := err.Error()
		rig.wrong.Store(&msg)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	// Under /at, so that a path starting with "//" stays a path: alone it
	// would be a network-path reference the client cannot parse.
	w.Header().Set("Location", "/at"+r.URL.EscapedPath())
	w.WriteHeader(in.answer)
	fmt.Fprintf(w, "run %d of %s %q: %d bytes", run, r.Method, r.URL.Path, len(body))
}

func (rig *middlewareRig) effect(ctx context.Context) error {
	tx, err := idemhttp.Tx(ctx)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO fuzz_effects DEFAULT VALUES`)
	return err
}

// reset empties the tables and the counters for the next input.
func (rig *middlewareRig) reset(t *testing.T) {
	_, err := rig.db.Exec(context.Background(), `DELETE FROM onceflow_keys; DELETE FROM fuzz_effects`)
	require.NoError(t, err)
	rig.runs.Store(0)
	rig.wrong.Store(nil)
}

// fuzzReply is an answer as the client saw it.
type fuzzReply struct {
	status int
	header http.Header
	body   []byte
}

// send sends in over the wire where a client can, and to ServeHTTP where
// it cannot.
func (rig *middlewareRig) send(t *testing.T, in middlewareInput) fuzzReply {
	rig.current.Store(&in)
	if !in.overWire() {
		return rig.serve(in)
	}
	req, err := http.NewRequest(in.method, rig.url, bytes.NewReader(in.body))
	require.NoError(t, err, in)
	req.URL.Path = in.path
	req.Header = in.header()
	resp, err := rig.client.Do(req)
	require.NoError(t, err, in)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err, in)
	return fuzzReply{resp.StatusCode, resp.Header, body}
}

// serve calls ServeHTTP with a request no client would send.
func (rig *middlewareRig) serve(in middlewareInput) fuzzReply {
	req := (&http.Request{
		Method: in.method, URL: &url.URL{Path: in.path}, RequestURI: in.path, Host: "onceflow.test",
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: in.header(),
		Body: io.NopCloser(bytes.NewReader(in.body)), ContentLength: int64(len(in.body)),
		RemoteAddr: "192.0.2.1:1234",
	}).WithContext(context.Background())
	rec := httptest.NewRecorder()
	rig.handler.ServeHTTP(rec, req)
	return fuzzReply{rec.Code, rec.Header(), rec.Body.Bytes()}
}

// check sends in and holds the answer, the handler's runs and the stored
// rows to the documentation.
func (rig *middlewareRig) check(t *testing.T, in middlewareInput) {
	first := rig.send(t, in)
	want := expectMiddleware(in)
	if want == 0 && first.status == http.StatusBadRequest && rig.runs.Load() == 0 && !isToken(in.method) {
		want = http.StatusBadRequest // not HTTP, refused or not: either is fine
	}
	if want != 0 {
		requireProblem(t, first, want, in)
		require.Zero(t, rig.runs.Load(), "the handler ran for a refused request: %v", in)
		rig.requireStored(t, 0, in)
		return
	}
	require.Equal(t, in.answer, first.status, "%v: %s", in, first.body)
	require.Equal(t, int32(1), rig.runs.Load(), in)
	require.Nil(t, rig.wrong.Load(), in)
	require.Empty(t, first.header.Get(idemhttp.ReplayedHeader), in)
	again := rig.send(t, in)
	require.Equal(t, first.status, again.status, in)
	if !idemhttp.StoreDefault(in.answer) {
		require.Equal(t, int32(2), rig.runs.Load(), "a request not stored runs again: %v", in)
		rig.requireStored(t, 0, in)
		return
	}
	require.Equal(t, int32(1), rig.runs.Load(), "a stored request ran again: %v", in)
	require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader), in)
	require.Equal(t, string(first.body), string(again.body), in)
	for _, name := range []string{"Content-Type", "Location"} {
		require.Equal(t, first.header.Values(name), again.header.Values(name), "%s: %v", name, in)
	}
	rig.requireStored(t, 1, in)
}

// requireStored checks that n keys are stored, completed, each with the
// handler's row.
func (rig *middlewareRig) requireStored(t *testing.T, n int, in middlewareInput) {
	var keys, completed, effects int
	require.NoError(t, rig.db.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM onceflow_keys),
		(SELECT count(*) FROM onceflow_keys WHERE status = 'completed'),
		(SELECT count(*) FROM fuzz_effects)`).Scan(&keys, &completed, &effects))
	require.Equal(t, []int{n, n, n}, []int{keys, completed, effects}, "keys, completed keys, handler rows: %v", in)
}

// requireProblem checks that r is an RFC 9457 problem with status.
func requireProblem(t *testing.T, r fuzzReply, status int, in fmt.Stringer) {
	require.Equal(t, status, r.status, "%v: %s", in, r.body)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), in)
	var p struct {
		Status int    `json:"status"`
		Title  string `json:"title"`
		Detail string `json:"detail"`
	}
	require.NoError(t, json.Unmarshal(r.body, &p), "%v: %s", in, r.body)
	require.Equal(t, status, p.Status, in)
	require.NotEmpty(t, p.Title, in)
	require.NotEmpty(t, p.Detail, in)
}

// fuzzOrder is FuzzWorkflowHandler's request: a little of every JSON kind,
// and a field that takes any JSON.
type fuzzOrder struct {
	Customer string          `json:"customer"`
	Cents    int64           `json:"cents"`
	Items    []fuzzItem      `json:"items,omitempty"`
	Meta     json.RawMessage `json:"meta,omitempty"`
}

type fuzzItem struct {
	SKU string `json:"sku"`
	Qty int64  `json:"qty"`
}

func (o fuzzOrder) Validate() error {
	if o.Cents <= 0 {
		return errors.New("cents must be positive")
	}
	return nil
}

// fuzzReceipt is the workflow's state and answer: the order as decoded.
type fuzzReceipt struct {
	Row   int64     `json:"row"`
	Order fuzzOrder `json:"order"`
}

// FuzzWorkflowHandler sends any body to a Workflow handler and checks:
//   - the answer is what the request's documented rules give, worked out
//     with encoding/json: 400 for a body that is not one JSON value (or is
//     invalid UTF-8, nested deeper than 512, has a key twice) or not the
//     request's shape, 422 for a request Validate refuses, 413 for a body
//     over the limit, and 201 otherwise;
//   - a refusal is problem+json, runs no step and stores no record;
//   - the same body again gets the same answer, replayed when it was 201,
//     and so does the body written another way (keys in another order,
//     other whitespace, numbers with an exponent).
func FuzzWorkflowHandler(f *testing.F) {
	for _, seed := range []string{
		`{"customer":"c-1","cents":1999,"items":[{"sku":"a","qty":2}],"meta":{"b":[1,2],"a":null}}`,
		`{"cents":5e2}`,
		`{"cents":500.000}`,
		`{"CENTS":1,"Customer":"no case folding"}`,
		`{"cents":1,"Cents":2}`,
		`{"cents":1,"items":[{"SKU":"a","qty":1}]}`,
		`{"cents":1,"ſku":1}`,
		`{"cents":0}`,
		`{"cents":-1}`,
		`{"cents":-0}`,
		`null`,
		`{}`,
		`{"cents":1.5}`,
		`{"cents":"1"}`,
		`{"cents":9223372036854775807}`,
		`{"cents":9223372036854775808}`,
		`{"cents":1e999999999}`,
		`{"cents":1,"meta":1e999999999}`,
		`{"cents":1,"meta":-1e-999999999}`,
		`{"cents":1,"meta":123456789012345678901234567890e-10}`,
		`{"cents":1,"extra":true}`,
		`{"cents":1,"cents":2}`,
		`{"cents":1,"customer":"a\u0000b","meta":"\u0000"}`,
		`{"cents":1,"customer":"\ud800","meta":["\udc00\ud800"]}`,
		`{"cents":1,"meta":{"\ud800":1,"\ufffd":2}}`,
		"{\"cents\":1,\"customer\":\"\xff\"}",
		"{\"cents\":1,\"customer\":\"a\x00b\"}",
		"\x00{\"cents\":1}",
		"\xef\xbb\xbf{\"cents\":1}",
		`{"cents":1} {}`,
		`{"cents":1}]`,
		`{"cents":1`,
		`{"cents":}`,
		`[1,2,3]`,
		`"cents"`,
		``,
		` `,
		`{"items":[{"sku":"a","qty":1.0},null],"cents":1}`,
		`{"items":[{"sku":"a","price":1}],"cents":1}`,
		`{"items":{"sku":"a"},"cents":1}`,
		`{"cents":1,"meta":` + strings.Repeat("[", 511) + strings.Repeat("]", 511) + `}`,
		`{"cents":1,"meta":` + strings.Repeat("[", 512) + strings.Repeat("]", 512) + `}`,
		strings.Repeat("[", 5000) + strings.Repeat("]", 5000),
		strings.Repeat(`{"a":`, 3000) + "1" + strings.Repeat("}", 3000),
		strings.Repeat("[", 20000),
		`{"cents":1,"customer":"` + strings.Repeat("x", idemhttp.MaxBodyDefault) + `"}`,
		// Exactly MaxBodyDefault bytes: taken, though a respelling of it
		// is larger and refused.
		`{"cents":1,"customer":"` + strings.Repeat("x", idemhttp.MaxBodyDefault-25) + `"}`,
	} {
		f.Add([]byte(seed))
	}
	rig := newWorkflowRig(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		rig.reset(t)
		rig.check(t, body)
	})
}

// workflowRig is a real server with a Workflow handler whose one step
// writes a row; there is one per fuzzing process.
type workflowRig struct {
	db     *pgxpool.Pool
	url    string
	client *http.Client
	runs   atomic.Int32
}

func newWorkflowRig(f *testing.F) *workflowRig {
	rig := &workflowRig{db: dbtest.NewPool(f, 4)}
	_, err := rig.db.Exec(context.Background(), `CREATE TABLE fuzz_orders (id bigserial PRIMARY KEY)`)
	require.NoError(f, err)
	wf := workflow.Define("fuzz_order",
		phase.Atomic("record", func(ctx context.Context, tx pgx.Tx, r *phase.Run[fuzzOrder, fuzzReceipt]) error {
			rig.runs.Add(1)
			r.State.Order = r.Request
			return tx.QueryRow(ctx, `INSERT INTO fuzz_orders DEFAULT VALUES RETURNING id`).Scan(&r.State.Row)
		}),
	).Finish(func(s *fuzzReceipt) workflow.Response { return workflow.JSON(http.StatusCreated, s) })
	engine, err := workflow.NewEngine(rig.db, workflow.Config{})
	require.NoError(f, err)
	h, err := idemhttp.Workflow(engine, wf, idemhttp.WorkflowConfig{Tenant: trustedTenant})
	require.NoError(f, err)
	srv := httptest.NewServer(h)
	f.Cleanup(srv.Close)
	rig.url, rig.client = srv.URL, srv.Client()
	return rig
}

func (rig *workflowRig) reset(t *testing.T) {
	_, err := rig.db.Exec(context.Background(), `DELETE FROM onceflow_keys; DELETE FROM fuzz_orders`)
	require.NoError(t, err)
	rig.runs.Store(0)
}

// fuzzBody prints a body in failure messages.
type fuzzBody []byte

func (b fuzzBody) String() string { return fmt.Sprintf("%d-byte body %.200q", len(b), []byte(b)) }

func (rig *workflowRig) send(t *testing.T, body []byte) fuzzReply {
	req, err := http.NewRequest(http.MethodPost, rig.url+"/v1/orders", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set(idemhttp.Header, "k1")
	req.Header.Set("X-Tenant-ID", "acme")
	resp, err := rig.client.Do(req)
	require.NoError(t, err, fuzzBody(body))
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err, fuzzBody(body))
	return fuzzReply{resp.StatusCode, resp.Header, b}
}

func (rig *workflowRig) check(t *testing.T, body []byte) {
	first := rig.send(t, body)
	doc, want, sure := expectOrder(body)
	if !sure && slices.Contains([]int{http.StatusCreated, http.StatusBadRequest, http.StatusUnprocessableEntity}, first.status) {
		want = first.status
	}
	require.Equal(t, want, first.status, "%v: %s", fuzzBody(body), first.body)
	again := rig.send(t, body)
	require.Equal(t, first.status, again.status, fuzzBody(body))
	require.Equal(t, string(first.body), string(again.body), fuzzBody(body))
	if want != http.StatusCreated {
		requireProblem(t, first, want, fuzzBody(body))
		require.Zero(t, rig.runs.Load(), "a step ran for a refused request: %v", fuzzBody(body))
		rig.requireStored(t, 0, body)
		return
	}
	require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader), fuzzBody(body))
	if variant, ok := doc.Respell(); ok && len(variant) <= idemhttp.MaxBodyDefault {
		// A respelling longer than the limit would be refused for its
		// size, which says nothing of the fingerprint.
		other := rig.send(t, variant)
		require.Equal(t, http.StatusCreated, other.status, "%v respelled as %v: %.200s", fuzzBody(body), fuzzBody(variant), other.body)
		require.Equal(t, string(first.body), string(other.body), "%v respelled as %v", fuzzBody(body), fuzzBody(variant))
		require.Equal(t, "true", other.header.Get(idemhttp.ReplayedHeader), fuzzBody(body))
	}
	require.Equal(t, int32(1), rig.runs.Load(), fuzzBody(body))
	rig.requireStored(t, 1, body)
}

func (rig *workflowRig) requireStored(t *testing.T, n int, body []byte) {
	var keys, completed, orders int
	require.NoError(t, rig.db.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM onceflow_keys),
		(SELECT count(*) FROM onceflow_keys WHERE status = 'completed'),
		(SELECT count(*) FROM fuzz_orders)`).Scan(&keys, &completed, &orders))
	require.Equal(t, []int{n, n, n}, []int{keys, completed, orders}, "keys, completed keys, orders: %v", fuzzBody(body))
}

// expectOrder says what Workflow answers to body, worked out with
// encoding/json rather than onceflow: the document, the status, and
// whether the status is sure; it is not where the answer turns on a rule
// modelled only loosely here (a lone surrogate's key colliding, a huge
// exponent).
func expectOrder(body []byte) (doc *jsontest.Doc, status int, sure bool) {
	if len(body) > idemhttp.MaxBodyDefault {
		return nil, http.StatusRequestEntityTooLarge, true
	}
	doc, err := jsontest.Read(body, recovery.MaxJSONDepth)
	switch {
	case err != nil:
		return nil, http.StatusBadRequest, true
	case doc.DuplicateKey && !doc.Replacement:
		return nil, http.StatusBadRequest, true
	}
	status, sure = orderStatus(doc.Value)
	return doc, status, sure && !doc.DuplicateKey && !doc.BigExponent
}

// orderStatus checks a well-formed document against fuzzOrder as strict
// decoding does (field names match exactly; null leaves a field alone) and
// then against Validate.
func orderStatus(doc any) (int, bool) {
	if doc == nil {
		return http.StatusUnprocessableEntity, true // a zero request
	}
	members, ok := doc.([]jsontest.Member)
	if !ok {
		return http.StatusBadRequest, true
	}
	var cents int64
	seen := map[string]bool{}
	for _, m := range members {
		field := fieldOf(m.Key, "customer", "cents", "items", "meta")
		if field == "" {
			return http.StatusBadRequest, true // unknown field
		}
		ok, sure := true, !seen[field]
		seen[field] = true
		switch field {
		case "customer":
			ok = isKind[string](m.Value)
		case "cents":
			var s bool
			cents, ok, s = integerIn(m.Value, cents)
			sure = sure && s
		case "items":
			ok, sure = itemsOK(m.Value)
		}
		if !sure {
			return 0, false
		}
		if !ok {
			return http.StatusBadRequest, true
		}
	}
	if cents <= 0 {
		return http.StatusUnprocessableEntity, true
	}
	return http.StatusCreated, true
}

func itemsOK(v any) (ok, sure bool) {
	items, isArray := v.([]any)
	if v == nil {
		return true, true
	}
	if !isArray {
		return false, true
	}
	for _, item := range items {
		members, isObject := item.([]jsontest.Member)
		if item != nil && !isObject {
			return false, true
		}
		seen := map[string]bool{}
		for _, m := range members {
			field := fieldOf(m.Key, "sku", "qty")
			if field == "" || seen[field] {
				return false, field == "" // a field set twice: which value wins?
			}
			seen[field] = true
			ok, s := isKind[string](m.Value), true
			if field == "qty" {
				_, ok, s = integerIn(m.Value, 0)
			}
			if !ok || !s {
				return ok, s
			}
		}
	}
	return true, true
}

// fieldOf returns the field a member's key sets, or "": names match
// exactly, case included.
func fieldOf(key string, fields ...string) string {
	if slices.Contains(fields, key) {
		return key
	}
	return ""
}

// isKind reports a value that decodes into a T: a T or null.
func isKind[T any](v any) bool {
	_, ok := v.(T)
	return ok || v == nil
}

// integerIn decodes v into an int64 field holding old: a number whose
// value is an integer in range (5e2 and 500.0 are 500), or null. sure is
// false for an exponent too large to work out.
func integerIn(v any, old int64) (n int64, ok, sure bool) {
	if v == nil {
		return old, true, true
	}
	lit, isNumber := v.(json.Number)
	if !isNumber {
		return 0, false, true
	}
	if _, exp, found := strings.Cut(strings.ToLower(string(lit)), "e"); found {
		if e, err := strconv.Atoi(exp); err != nil || e > 1000 || e < -1000 {
			return 0, false, false
		}
	}
	r, _ := new(big.Rat).SetString(string(lit))
	if !r.IsInt() || !r.Num().IsInt64() {
		return 0, false, true
	}
	return r.Num().Int64(), true, true
}
