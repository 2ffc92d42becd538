package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
)

// The PATCH tests serve with --sweep-every 1h: the relay, sending a
// receipt, would give the order a new version while a test holds its ETag.
const noSweep = "1h"

// patchAddress sends PATCH /v1/orders/{id} as tenant, with ifMatch as
// If-Match unless it is "", and body.
func (e *env) patchAddress(p *serveProcess, tenant, id, ifMatch, body string) call {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, http.MethodPatch, p.URL+"/v1/orders/"+id, strings.NewReader(body))
	require.NoError(e.t, err)
	authorize(req, tenant)
	req.Header.Set("Content-Type", "application/json")
	if ifMatch != "" {
		req.Header.Set("If-Match", ifMatch)
	}
	return e.send(req)
}

// getOrder sends GET /v1/orders/{id} as acme, with header.
func (e *env) getOrder(p *serveProcess, id string, header http.Header) call {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, p.URL+"/v1/orders/"+id, nil)
	require.NoError(e.t, err)
	for name, values := range header {
		req.Header[name] = values
	}
	authorize(req, "acme")
	return e.send(req)
}

// addressJSON is the body of a PATCH that sets address.
func addressJSON(address string) string {
	b, _ := json.Marshal(map[string]string{"shipping_address": address})
	return string(b)
}

// newPaidOrder checks out as acme under key and returns the paid order's id.
func newPaidOrder(e *env, p *serveProcess, key string) string {
	e.t.Helper()
	res := e.checkout(p, key, order)
	require.Equal(e.t, http.StatusCreated, res.status, res.body)
	var paid struct {
		OrderID string `json:"order_id"`
	}
	require.NoError(e.t, json.Unmarshal([]byte(res.body), &paid))
	return paid.OrderID
}

// shownOrder is what GET and PATCH answer of an order.
type shownOrder struct {
	Status          string  `json:"status"`
	ShippingAddress *string `json:"shipping_address"`
}

func decodeOrder(t *testing.T, c call) shownOrder {
	t.Helper()
	require.Equal(t, http.StatusOK, c.status, c.body)
	var o shownOrder
	require.NoError(t, json.Unmarshal([]byte(c.body), &o))
	return o
}

// TestPatchShippingAddress: GET gives the order's ETag; a PATCH needs
// If-Match (428), names the current version (412 otherwise, a retry of a
// PATCH that succeeded included), is its tenant's alone (404), has a valid
// body (400, 413, 415, 422, the order unchanged), and answers the order and
// a new ETag, which GET then shows (and answers 304 to).
func TestPatchShippingAddress(t *testing.T) {
	e := newEnv(t)
	app := e.serve("--sweep-every", noSweep)
	id := newPaidOrder(e, app, "k-1")

	got := e.getOrder(app, id, nil)
	require.Nil(t, decodeOrder(t, got).ShippingAddress)
	tag := got.header.Get("ETag")
	_, ok := idemhttp.VersionFromETag(tag)
	require.True(t, ok, "GET answers the order's ETag, not %q", tag)

	const address = "1 Main St, Springfield"
	requireProblem(t, e.patchAddress(app, "acme", id, "", addressJSON(address)), http.StatusPreconditionRequired)
	onlyIfNoneMatch, err := http.NewRequest(http.MethodPatch, app.URL+"/v1/orders/"+id, strings.NewReader(addressJSON(address)))
	require.NoError(t, err)
	authorize(onlyIfNoneMatch, "acme")
	onlyIfNoneMatch.Header.Set("Content-Type", "application/json")
	onlyIfNoneMatch.Header.Set("If-None-Match", `"v0"`)
	requireProblem(t, e.send(onlyIfNoneMatch), http.StatusPreconditionRequired)
	requireProblem(t, e.patchAddress(app, "globex", id, tag, addressJSON(address)), http.StatusNotFound)
	requireProblem(t, e.patchAddress(app, "acme", "ord_unknown", tag, addressJSON(address)), http.StatusNotFound)
	requireProblem(t, e.patchAddress(app, "", id, tag, addressJSON(address)), http.StatusUnauthorized)
	requireProblem(t, e.patchAddress(app, "acme", id, `"v0"`, addressJSON(address)), http.StatusPreconditionFailed)
	requireProblem(t, e.patchAddress(app, "acme", id, "W/"+tag, addressJSON(address)), http.StatusPreconditionFailed)
	requireProblem(t, e.patchAddress(app, "acme", id, "v1", addressJSON(address)), http.StatusBadRequest)
	for body, status := range map[string]int{
		`{}`:                                              http.StatusUnprocessableEntity,
		`{"shipping_address":" "}`:                        http.StatusUnprocessableEntity,
		`{"shipping_address":"a\nb"}`:                     http.StatusUnprocessableEntity,
		`{"shipping_address":"a\u0000b"}`:                 http.StatusUnprocessableEntity,
		addressJSON(strings.Repeat("x", 501)):             http.StatusUnprocessableEntity,
		`{"shipping_address":null}`:                       http.StatusBadRequest,
		`{"shipping_address":1}`:                          http.StatusBadRequest,
		`{"Shipping_Address":"x"}`:                        http.StatusBadRequest,
		`{"shipping_address":"x","status":"paid"}`:        http.StatusBadRequest,
		`{"shipping_address":"x","shipping_address":"y"}`: http.StatusBadRequest,
		`{"shipping_address":"x"} {}`:                     http.StatusBadRequest,
		`["x"]`:                                           http.StatusBadRequest,
		"{\"shipping_address\":\"\xff\"}":                 http.StatusBadRequest,
		addressJSON(strings.Repeat("x", 5000)):            http.StatusRequestEntityTooLarge,
	} {
		requireProblem(t, e.patchAddress(app, "acme", id, tag, body), status)
	}
	req, err := http.NewRequest(http.MethodPatch, app.URL+"/v1/orders/"+id, strings.NewReader("shipping_address=x"))
	require.NoError(t, err)
	authorize(req, "acme")
	req.Header.Set("If-Match", tag)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	requireProblem(t, e.send(req), http.StatusUnsupportedMediaType)
	require.Equal(t, tag, e.getOrder(app, id, nil).header.Get("ETag"), "no refused PATCH changed the order")

	patched := e.patchAddress(app, "acme", id, tag, addressJSON(address))
	o := decodeOrder(t, patched)
	require.Equal(t, address, *o.ShippingAddress)
	require.Equal(t, "paid", o.Status)
	newTag := patched.header.Get("ETag")
	require.NotEqual(t, tag, newTag)

	got = e.getOrder(app, id, nil)
	require.Equal(t, address, *decodeOrder(t, got).ShippingAddress)
	require.Equal(t, newTag, got.header.Get("ETag"))
	notModified := e.getOrder(app, id, http.Header{"If-None-Match": {newTag}})
	require.Equal(t, http.StatusNotModified, notModified.status)
	require.Empty(t, notModified.body)
	require.Equal(t, newTag, notModified.header.Get("ETag"))
	require.Equal(t, http.StatusOK, e.getOrder(app, id, http.Header{"If-None-Match": {tag}}).status)

	requireProblem(t, e.patchAddress(app, "acme", id, tag, addressJSON("2 Other St")), http.StatusPreconditionFailed)
	requireProblem(t, e.patchAddress(app, "acme", id, tag, addressJSON(address)), http.StatusPreconditionFailed)
	require.Equal(t, address, *decodeOrder(t, e.getOrder(app, id, nil)).ShippingAddress, "a stale PATCH changes nothing")
}

var declinedOrderID = regexp.MustCompile(`ord_[0-9a-f]+`)

// TestPatchOfAClosedOrderIsConflict: a declined order never ships, so its
// address may not change: 409, even with the current ETag.
func TestPatchOfAClosedOrderIsConflict(t *testing.T) {
	e := newEnv(t)
	app := e.serve("--sweep-every", noSweep)
	declined := e.checkout(app, "k-1", strings.Replace(order, "tok_visa", "tok_decline", 1))
	require.Equal(t, http.StatusPaymentRequired, declined.status, declined.body)
	id := declinedOrderID.FindString(declined.body)
	require.NotEmpty(t, id, declined.body)

	got := e.getOrder(app, id, nil)
	require.Equal(t, "declined", decodeOrder(t, got).Status)
	conflict := e.patchAddress(app, "acme", id, got.header.Get("ETag"), addressJSON("1 Main St"))
	requireProblem(t, conflict, http.StatusConflict)
	require.Contains(t, conflict.body, "declined")
	require.Nil(t, decodeOrder(t, e.getOrder(app, id, nil)).ShippingAddress)
}

// TestConcurrentPatchesOneWins: in each round, 8 PATCHes with the order's
// current ETag start together; exactly one is 200, the others 412, and the
// order holds the winner's address at the version after.
func TestConcurrentPatchesOneWins(t *testing.T) {
	e := newEnv(t)
	app := e.serve("--sweep-every", noSweep)
	id := newPaidOrder(e, app, "k-1")
	const clients = 8
	for round := range 5 {
		tag := e.getOrder(app, id, nil).header.Get("ETag")
		version, ok := idemhttp.VersionFromETag(tag)
		require.True(t, ok, tag)
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			answers = make([]call, clients)
		)
		for i := range clients {
			wg.Go(func() {
				req, _ := http.NewRequest(http.MethodPatch, app.URL+"/v1/orders/"+id,
					strings.NewReader(addressJSON(fmt.Sprintf("round %d, client %d", round, i))))
				authorize(req, "acme")
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("If-Match", tag)
				<-start
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					answers[i] = call{status: -1, body: err.Error()}
					return
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				answers[i] = call{resp.StatusCode, resp.Header, string(b)}
			})
		}
		close(start)
		wg.Wait()
		var winner *call
		statuses := map[int]int{}
		for i := range answers {
			statuses[answers[i].status]++
			if answers[i].status == http.StatusOK {
				winner = &answers[i]
			}
		}
		require.Equal(t, map[int]int{http.StatusOK: 1, http.StatusPreconditionFailed: clients - 1}, statuses, "round %d", round)
		won := decodeOrder(t, *winner)
		require.Equal(t, idemhttp.ETag(version+1), winner.header.Get("ETag"))
		got := e.getOrder(app, id, nil)
		require.Equal(t, *won.ShippingAddress, *decodeOrder(t, got).ShippingAddress)
		require.Equal(t, idemhttp.ETag(version+1), got.header.Get("ETag"))
	}
}

// TestOrdersOfAnEarlierReleaseGetVersions: a server started on a database
// whose checkout_orders an earlier release made (no version, no shipping
// address) adds the columns: its orders are at version 1 and can be
// patched.
func TestOrdersOfAnEarlierReleaseGetVersions(t *testing.T) {
	e := newEnv(t)
	conn, err := pgx.Connect(e.ctx, e.dbURL)
	require.NoError(t, err)
	defer conn.Close(e.ctx)
	_, err = conn.Exec(e.ctx, `
		CREATE TABLE checkout_orders (
		    id           text        PRIMARY KEY,
		    tenant_id    text        NOT NULL,
		    customer_id  text        NOT NULL,
		    amount_cents bigint      NOT NULL,
		    currency     text        NOT NULL,
		    items        jsonb       NOT NULL,
		    status       text        NOT NULL,
		    charge_id    text,
		    created_at   timestamptz NOT NULL DEFAULT now()
		);
		INSERT INTO checkout_orders (id, tenant_id, customer_id, amount_cents, currency, items, status, charge_id)
		VALUES ('ord_old', 'acme', 'cus_1', 4200, 'usd', '[{"sku":"book","qty":1}]', 'paid', 'ch_old');`)
	require.NoError(t, err)

	app := e.serve("--sweep-every", noSweep)
	got := e.getOrder(app, "ord_old", nil)
	require.Nil(t, decodeOrder(t, got).ShippingAddress)
	require.Equal(t, idemhttp.ETag(1), got.header.Get("ETag"))
	patched := e.patchAddress(app, "acme", "ord_old", idemhttp.ETag(1), addressJSON("1 Main St"))
	require.Equal(t, "1 Main St", *decodeOrder(t, patched).ShippingAddress)
	require.Equal(t, idemhttp.ETag(2), patched.header.Get("ETag"))
}

// TestReceiptGivesTheOrderANewETag: the order shows receipt_sent, so
// sending the receipt makes a new version: an ETag read before it no
// longer matches. The first server never sweeps; a second one, on the same
// database, sends the receipt.
func TestReceiptGivesTheOrderANewETag(t *testing.T) {
	e := newEnv(t)
	app := e.serve("--sweep-every", noSweep)
	id := newPaidOrder(e, app, "k-1")
	before := e.getOrder(app, id, nil)
	require.Contains(t, before.body, `"receipt_sent":false`)

	relay := e.serve("--sweep-every", "1s")
	var after call
	require.Eventually(t, func() bool {
		after = e.getOrder(relay, id, nil)
		return strings.Contains(after.body, `"receipt_sent":true`)
	}, time.Minute, 100*time.Millisecond, "the relay runs every second")
	require.NotEqual(t, before.header.Get("ETag"), after.header.Get("ETag"))
	requireProblem(t, e.patchAddress(app, "acme", id, before.header.Get("ETag"), addressJSON("1 Main St")), http.StatusPreconditionFailed)
}

// TestStartDoesNotWaitForOrderWrites: a server that starts on an up-to-date
// database takes no lock that waits for the order writes under way (here
// an open transaction holding what an UPDATE of an order holds), as ALTER
// TABLE would, holding up every later write behind it. Whether the start
// waits is seen in pg_stat_activity, not guessed from time.
func TestStartDoesNotWaitForOrderWrites(t *testing.T) {
	e := newEnv(t)
	e.serve("--sweep-every", noSweep) // creates the tables
	conn, err := pgx.Connect(e.ctx, e.dbURL)
	require.NoError(t, err)
	defer conn.Close(e.ctx)
	tx, err := conn.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(e.ctx) }()
	_, err = tx.Exec(e.ctx, `LOCK TABLE checkout_orders IN ROW EXCLUSIVE MODE`)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	started := make(chan error, 1)
	go func() {
		p, err := startServe(ctx, binary, "--database-url", e.dbURL, "--provider-url", e.provider, "--sweep-every", noSweep)
		if err == nil {
			p.Stop()
		}
		started <- err
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-started:
			require.NoError(t, err)
			return
		case <-tick.C:
			require.Zero(t, e.count(`SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock'`),
				"the starting server waits for the open transaction's lock")
		}
	}
}
