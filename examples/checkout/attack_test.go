package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
)

// The attack suite: each test tries, against a running checkout server, what
// an attacker would.

// checkoutRequest is a POST /v1/checkouts of body under key, with no
// credentials.
func checkoutRequest(t *testing.T, base, key, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/checkouts", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return req
}

func requireProblem(t *testing.T, c call, status int) {
	t.Helper()
	require.Equal(t, status, c.status, c.body)
	require.Equal(t, "application/problem+json", c.header.Get("Content-Type"), c.body)
}

// requireUnauthorized checks a 401 that says how to authenticate.
func requireUnauthorized(t *testing.T, c call, what string) {
	t.Helper()
	require.Equal(t, http.StatusUnauthorized, c.status, "%s: %s", what, c.body)
	require.Equal(t, "application/problem+json", c.header.Get("Content-Type"), what)
	require.True(t, strings.HasPrefix(c.header.Get("WWW-Authenticate"), "Bearer"), "%s: WWW-Authenticate %q", what, c.header.Get("WWW-Authenticate"))
}

type paidOrder struct {
	OrderID  string `json:"order_id"`
	ChargeID string `json:"charge_id"`
}

// TestForgedTenantHeaderIsIgnored: with API keys, the tenant is the key's.
// globex, sending acme's X-Tenant-ID with acme's key and body, gets a fresh
// checkout of its own, not acme's stored answer, and cannot read acme's
// order; the header alone, with no key, is 401.
func TestForgedTenantHeaderIsIgnored(t *testing.T) {
	e := newEnv(t)
	app := e.serve()
	victim := e.checkout(app, "k-1", order)
	require.Equal(t, http.StatusCreated, victim.status, victim.body)
	var acme paidOrder
	require.NoError(t, json.Unmarshal([]byte(victim.body), &acme))

	forged := checkoutRequest(t, app.URL, "k-1", order)
	authorize(forged, "globex")
	forged.Header.Set("X-Tenant-ID", "acme")
	got := e.send(forged)
	require.Equal(t, http.StatusCreated, got.status, got.body)
	require.Empty(t, got.header.Get("Idempotent-Replayed"), "globex got acme's stored answer: %s", got.body)
	var globex paidOrder
	require.NoError(t, json.Unmarshal([]byte(got.body), &globex))
	require.NotEqual(t, acme.OrderID, globex.OrderID)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM onceflow_keys WHERE tenant_id = 'globex'`), "the checkout is globex's")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM checkout_orders WHERE tenant_id = 'acme'`))

	read, err := http.NewRequest(http.MethodGet, app.URL+"/v1/orders/"+acme.OrderID, nil)
	require.NoError(t, err)
	authorize(read, "globex")
	read.Header.Set("X-Tenant-ID", "acme")
	requireProblem(t, e.send(read), http.StatusNotFound)

	for _, r := range []*http.Request{checkoutRequest(t, app.URL, "k-2", order), read.Clone(e.ctx)} {
		r.Header.Del("Authorization")
		r.Header.Set("X-Tenant-ID", "acme")
		requireUnauthorized(t, e.send(r), r.Method+" with X-Tenant-ID and no key")
	}
	require.Len(t, e.charges(), 2)
}

// TestMissingOrUnknownKeyIs401: a checkout or an order read without a key,
// with a key no tenant has, or with another scheme, is 401 with a Bearer
// challenge, and nothing is recorded or charged.
func TestMissingOrUnknownKeyIs401(t *testing.T) {
	e := newEnv(t)
	app := e.serve()
	paid := e.checkout(app, "k-1", order)
	require.Equal(t, http.StatusCreated, paid.status, paid.body)
	var acme paidOrder
	require.NoError(t, json.Unmarshal([]byte(paid.body), &acme))

	for name, authorization := range map[string]string{
		"no key":                "",
		"unknown key":           "Bearer " + apiKeyOf("initech"),
		"empty key":             "Bearer ",
		"key of another scheme": "Basic " + apiKeyOf("acme"),
		"key in other case":     "Bearer " + strings.ToUpper(apiKeyOf("acme")),
		"key with a suffix":     "Bearer " + apiKeyOf("acme") + "x",
	} {
		post := checkoutRequest(t, app.URL, "k-2", order)
		read, err := http.NewRequest(http.MethodGet, app.URL+"/v1/orders/"+acme.OrderID, nil)
		require.NoError(t, err)
		for _, r := range []*http.Request{post, read} {
			if authorization != "" {
				r.Header.Set("Authorization", authorization)
			}
			res := e.send(r)
			requireUnauthorized(t, res, r.Method+" with "+name)
			require.NotContains(t, res.body, acme.OrderID)
		}
	}
	require.Equal(t, 1, e.count(`SELECT count(*) FROM onceflow_keys`), "no record for a refused request")
	require.Len(t, e.charges(), 1)
}

// TestTrustedTenantHeaderRefusesRepeats: behind an authenticating proxy
// (--trust-tenant-header), the tenant is X-Tenant-ID; a client's own copy
// beside the proxy's, appended or comma-joined, is 400, never resolved in
// the client's favour, and a request without it is 401.
func TestTrustedTenantHeaderRefusesRepeats(t *testing.T) {
	e := newEnv(t)
	app := e.serveWith("--trust-tenant-header")
	ok := checkoutRequest(t, app.URL, "k-1", order)
	ok.Header.Set("X-Tenant-ID", "acme")
	res := e.send(ok)
	require.Equal(t, http.StatusCreated, res.status, res.body)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM onceflow_keys WHERE tenant_id = 'acme'`))

	repeated := checkoutRequest(t, app.URL, "k-1", order)
	repeated.Header.Add("X-Tenant-ID", "acme")
	repeated.Header.Add("X-Tenant-ID", "globex")
	requireProblem(t, e.send(repeated), http.StatusBadRequest)
	joined := checkoutRequest(t, app.URL, "k-1", order)
	joined.Header.Set("X-Tenant-ID", "acme, globex")
	requireProblem(t, e.send(joined), http.StatusBadRequest)
	requireUnauthorized(t, e.send(checkoutRequest(t, app.URL, "k-1", order)), "no X-Tenant-ID")

	read, err := http.NewRequest(http.MethodGet, app.URL+"/v1/orders/ord_0000000000000000", nil)
	require.NoError(t, err)
	read.Header.Add("X-Tenant-ID", "acme")
	read.Header.Add("X-Tenant-ID", "globex")
	requireProblem(t, e.send(read), http.StatusBadRequest)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM onceflow_keys`), "no record for a refused request")
	require.Len(t, e.charges(), 1)
}

// TestServeWithoutKeysMakesOne: with neither --api-keys nor
// --trust-tenant-header, serve prints one new API key, for tenant demo, and
// accepts only it.
func TestServeWithoutKeysMakesOne(t *testing.T) {
	e := newEnv(t)
	app := e.serveWith()
	require.Regexp(t, `^ck_[0-9a-f]{48}$`, app.APIKey)

	req := checkoutRequest(t, app.URL, "k-1", order)
	req.Header.Set("Authorization", "Bearer "+app.APIKey)
	res := e.send(req)
	require.Equal(t, http.StatusCreated, res.status, res.body)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM onceflow_keys WHERE tenant_id = 'demo'`))

	header := checkoutRequest(t, app.URL, "k-2", order)
	header.Header.Set("X-Tenant-ID", "demo")
	requireUnauthorized(t, e.send(header), "X-Tenant-ID and no key")
	other := checkoutRequest(t, app.URL, "k-2", order)
	other.Header.Set("Authorization", "Bearer "+newAPIKey())
	requireUnauthorized(t, e.send(other), "another key")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM onceflow_keys`))

	again := e.serveWith()
	require.NotEqual(t, app.APIKey, again.APIKey, "each server makes a key of its own")
}

// TestValidateLimits: control characters, over-long strings, too many
// items and too large an amount are 422, with no record, order or charge;
// the limits themselves pass.
func TestValidateLimits(t *testing.T) {
	e := newEnv(t)
	app := e.serve()
	body := func(customer string, amount int64, card, sku string, items int) string {
		list := make([]Item, items)
		for i := range list {
			list[i] = Item{SKU: sku, Qty: 1}
		}
		b, err := json.Marshal(CheckoutRequest{CustomerID: customer, AmountCents: amount, Currency: "usd", CardToken: card, Items: list})
		require.NoError(t, err)
		return string(b)
	}
	long := strings.Repeat("x", 255)
	for name, c := range map[string]string{
		"NUL in customer_id":     body("cus\x00_1", 4200, "tok_visa", "book", 1),
		"ESC in a sku":           body("cus_1", 4200, "tok_visa", "book\x1b[2J", 1),
		"DEL in card_token":      body("cus_1", 4200, "tok_visa\x7f", "book", 1),
		"C1 in customer_id":      body("cus\u009b_1", 4200, "tok_visa", "book", 1),
		"newline in customer_id": body("cus_1\nX-Admin: yes", 4200, "tok_visa", "book", 1),
		"customer_id of 256":     body(long+"x", 4200, "tok_visa", "book", 1),
		"sku of 256":             body("cus_1", 4200, "tok_visa", long+"x", 1),
		"card_token of 256":      body("cus_1", 4200, "tok_"+long[4:]+"x", "book", 1),
		"101 items":              body("cus_1", 4200, "tok_visa", "book", 101),
		"amount over 10^9":       body("cus_1", 1_000_000_001, "tok_visa", "book", 1),
	} {
		res := e.checkout(app, "k-"+strings.ReplaceAll(name, " ", "-"), c)
		require.Equal(t, http.StatusUnprocessableEntity, res.status, "%s: %s", name, res.body)
	}
	require.Zero(t, e.count(`SELECT count(*) FROM onceflow_keys`), "no record for a refused request")

	res := e.checkout(app, "k-limits", body(long, 1_000_000_000, "tok_"+long[4:], long, 100))
	require.Equal(t, http.StatusCreated, res.status, "every limit itself passes: %s", res.body)
	require.Len(t, e.charges(), 1)
}

// TestProviderValidates: the fake provider refuses what a real one would,
// and a key quoted loosely; a key properly quoted is the same key bare.
func TestProviderValidates(t *testing.T) {
	e := newEnv(t)
	charge := func(key, body string) call {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, e.provider+"/charges", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		return e.send(req)
	}
	valid := `{"amount_cents":100,"currency":"usd","card_token":"tok_visa"}`
	for name, body := range map[string]string{
		"zero amount":      `{"amount_cents":0,"currency":"usd","card_token":"tok_visa"}`,
		"negative amount":  `{"amount_cents":-100,"currency":"usd","card_token":"tok_visa"}`,
		"no currency":      `{"amount_cents":100,"card_token":"tok_visa"}`,
		"unknown currency": `{"amount_cents":100,"currency":"usd|tok_visa","card_token":"tok_visa"}`,
		"no card token":    `{"amount_cents":100,"currency":"usd"}`,
		"not a token":      `{"amount_cents":100,"currency":"usd","card_token":"4242424242424242"}`,
	} {
		require.Equal(t, http.StatusBadRequest, charge("pk-"+strings.ReplaceAll(name, " ", "-"), body).status, name)
	}
	for _, key := range []string{`"pk-1`, `pk-1"`, `""pk-1""`, `"pk"-1"`, `pk 1`, `pk-1, pk-2`, `"pk-1";x`, `""`} {
		require.Equal(t, http.StatusBadRequest, charge(key, valid).status, "Idempotency-Key %s", key)
	}
	require.Empty(t, e.charges(), "nothing refused was charged")

	bare := charge("pk-1", valid)
	require.Equal(t, http.StatusCreated, bare.status, bare.body)
	quoted := charge(`"pk-1"`, valid)
	require.Equal(t, bare.body, quoted.body, "a quoted key is the same key")
	require.Len(t, e.charges(), 1)

	require.NotEqual(t,
		ChargeRequest{AmountCents: 100, Currency: "usd|tok_a", CardToken: "b"}.fingerprint(),
		ChargeRequest{AmountCents: 100, Currency: "usd", CardToken: "tok_a|b"}.fingerprint(),
		"two requests, two fingerprints")
}

// TestSlowClientsAreCutOff: a client that sends its headers or its body
// slowly, to hold a connection (and the memory behind it), is cut off by
// the server's read timeout; headers over the size limit are refused.
func TestSlowClientsAreCutOff(t *testing.T) {
	e := newEnv(t)
	const readTimeout = time.Second
	app := e.serve("--read-timeout", readTimeout.String())
	addr := strings.TrimPrefix(app.URL, "http://")
	// Far past the read timeout: a connection still open then is not cut off.
	const giveUp = 30 * readTimeout

	headers := "POST /v1/checkouts HTTP/1.1\r\nHost: checkout\r\nContent-Type: application/json\r\n" +
		"Authorization: Bearer " + apiKeyOf("acme") + "\r\nIdempotency-Key: slow\r\n"
	for name, sent := range map[string]string{
		"slow headers": headers,
		"slow body":    headers + fmt.Sprintf("Content-Length: %d\r\n\r\n", len(order)) + order[:10],
	} {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		_, err = io.WriteString(conn, sent) // and nothing more
		require.NoError(t, err)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(giveUp)))
		_, err = io.Copy(io.Discard, conn) // until the server closes the connection
		var netErr net.Error
		require.False(t, errors.As(err, &netErr) && netErr.Timeout(), "%s: the server kept the connection for %s", name, giveUp)
		require.NoError(t, conn.Close())
	}
	require.Zero(t, e.count(`SELECT count(*) FROM onceflow_keys`), "no slow request ran")

	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, headers+"X-Padding: "+strings.Repeat("x", 128<<10)+"\r\nContent-Length: 0\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(giveUp)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
}

// TestManySlowBodiesAreCutOff: many connections each declare a body of the
// size limit less one byte, send half of it and stall, to make the server
// hold their memory. Each is answered 408 and closed once the read timeout
// has passed, none runs a checkout, the server holds little more than what
// they sent, and it answers a normal checkout afterwards.
func TestManySlowBodiesAreCutOff(t *testing.T) {
	e := newEnv(t)
	const (
		conns       = 150
		declared    = idemhttp.MaxBodyDefault - 1
		sent        = declared / 2
		readTimeout = 3 * time.Second
		// closedWithin is the read timeout and as long again for a loaded
		// machine to act on it. It is short of idemhttp's body timeout
		// (10s), which alone would close them without the read timeout.
		closedWithin = 2 * readTimeout
		giveUp       = 10 * readTimeout
	)
	app := e.serve("--read-timeout", readTimeout.String())
	addr := strings.TrimPrefix(app.URL, "http://")
	warm := e.checkout(app, "k-before", order) // pool connections and the like are made
	require.Equal(t, http.StatusCreated, warm.status, warm.body)
	before := memoryKiB(t, app.Proc.Pid(), "VmHWM")

	headers := "POST /v1/checkouts HTTP/1.1\r\nHost: checkout\r\nContent-Type: application/json\r\n" +
		"Authorization: Bearer " + apiKeyOf("acme") + "\r\nIdempotency-Key: slow-%d\r\n" +
		fmt.Sprintf("Content-Length: %d\r\n\r\n", declared)
	half := bytes.Repeat([]byte(" "), sent)
	type outcome struct {
		status int
		detail string
		after  time.Duration // from dialling to the server closing the connection
		err    error
	}
	outcomes := make([]outcome, conns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			o := &outcomes[i]
			start := time.Now()
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				o.err = err
				return
			}
			defer conn.Close()
			if _, err := fmt.Fprintf(conn, headers, i); err != nil {
				o.err = err
				return
			}
			if _, err := conn.Write(half); err != nil { // then nothing more
				o.err = err
				return
			}
			if o.err = conn.SetReadDeadline(start.Add(giveUp)); o.err != nil {
				return
			}
			in := bufio.NewReader(conn)
			resp, err := http.ReadResponse(in, nil)
			if err != nil {
				o.err = err
				return
			}
			defer resp.Body.Close()
			o.status = resp.StatusCode
			detail, err := io.ReadAll(resp.Body)
			if err != nil {
				o.err = err
				return
			}
			o.detail = string(detail)
			_, err = io.Copy(io.Discard, in) // until the server closes the connection
			o.after = time.Since(start)
			var netErr net.Error
			if errors.As(err, &netErr) && netErr.Timeout() {
				o.err = fmt.Errorf("the server kept the connection for %s", giveUp)
			}
		})
	}
	wg.Wait()
	for i, o := range outcomes {
		require.NoError(t, o.err, "connection %d", i)
		require.Equal(t, http.StatusRequestTimeout, o.status, "connection %d", i)
		require.Contains(t, o.detail, "read timeout", "connection %d: the server's read timeout cut it off, not idemhttp's body timeout", i)
		require.LessOrEqual(t, o.after, closedWithin, "connection %d was closed %s after it was opened", i, o.after)
	}

	// The server holds what the connections sent, in the chunks it reads
	// them into, and a connection's own buffers and goroutine. The bound
	// allows a quarter more than what was sent, and 64 KiB a connection;
	// reading the whole declared body, or a second copy of what came,
	// exceeds it (conns × declared would be 150 MiB).
	const boundKiB = (conns*sent + conns*sent/4 + conns*64<<10) >> 10
	peak := memoryKiB(t, app.Proc.Pid(), "VmHWM")
	t.Logf("checkout serve's peak memory: %d KiB before, %d KiB after; bound: %d KiB more", before, peak, boundKiB)
	require.LessOrEqual(t, peak-before, int64(boundKiB),
		"checkout serve's peak memory went from %d KiB to %d KiB with %d connections each sending %d bytes", before, peak, conns, sent)

	require.Equal(t, 1, e.count(`SELECT count(*) FROM onceflow_keys`), "no slow request ran a checkout")
	after := e.checkout(app, "k-after", order)
	require.Equal(t, http.StatusCreated, after.status, after.body)
	require.Len(t, e.charges(), 2)
}

// memoryKiB reads a field of /proc/PID/status given in kB (VmRSS, VmHWM).
func memoryKiB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for line := range strings.Lines(string(status)) {
		if value, found := strings.CutPrefix(line, field+":"); found {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
			require.NoError(t, err, "%s: %q", field, line)
			return kib
		}
	}
	require.FailNow(t, "no "+field+" in /proc/PID/status")
	return 0
}

// TestOrderIDTheDatabaseCannotHoldIs404: an order id that is not valid
// UTF-8 or holds a NUL, which no order can have, is 404 like any other
// unknown id; it made the database refuse the query, which was answered 503
// ("could not be read") and logged as an error, at a client's will.
func TestOrderIDTheDatabaseCannotHoldIs404(t *testing.T) {
	e := newEnv(t)
	app := e.serve()
	for _, id := range []string{"%ff", "ord_%00", "ord_%c3%28"} {
		read, err := http.NewRequest(http.MethodGet, app.URL+"/v1/orders/"+id, nil)
		require.NoError(t, err)
		authorize(read, "acme")
		res := e.send(read)
		requireProblem(t, res, http.StatusNotFound)
		require.Contains(t, res.body, "no such order", id)
	}
	require.NotContains(t, app.Stderr(), "read order", "nothing to log")
}
