package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/faults"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// TestTenantsAreIsolatedOverHTTP: many tenants share a few Idempotency-Keys;
// no response, order, record or charge ever crosses a tenant. The tenants
// come in pairs whose names differ only in case. Every tenant's first use of
// its keys runs at once, each with a body of its own (some cards declined).
// Then, at once again, every one of them is sent a second time, which must
// replay its own answer byte for byte, and keys other tenants have used are
// sent under tenants new to them, some with a body copied from another
// tenant: each must be a fresh execution of its own, never a replay of the
// other tenant's answer, a 409 or a 422. Finally each order is read back by
// its tenant and refused to the others, and the key records, the orders and
// the provider's charges are checked pair by pair.
func TestTenantsAreIsolatedOverHTTP(t *testing.T) {
	e := newEnv(t)
	rnd := faults.Rand(t)
	started := time.Now()
	tenants := tenantNames(faults.Size(12, 60))
	e.tenants = tenants
	app := e.serve("--lease", "2s")
	first, late := tenantPairs(rnd, tenants)
	all := slices.Concat(first, late)
	ctx, cancel := context.WithTimeout(e.ctx, faults.Size(2*time.Minute, 10*time.Minute))
	defer cancel()
	client := tenantClient()

	// Every tenant's first use of its keys, all at once.
	tenantSettle(t, first, tenantSend(ctx, rnd, client, app.URL, first))

	// Every pair again, and the keys under tenants new to them, all at once.
	answers := tenantSend(ctx, rnd, client, app.URL, all)
	tenantSettle(t, late, answers[len(first):])
	tenantCheckReplays(t, first, answers[:len(first)])

	tenantCheckDistinct(t, all)
	reads, refusals := tenantCheckReads(t, e, rnd, app.URL, tenants, all)
	conn := tenantConnect(t, e)
	records := tenantRecords(t, conn)
	tenantCheckRecords(t, all, records)
	tenantCheckOrders(t, conn, all)
	tenantCheckCharges(t, e.charges(), all, records)

	declined, twins := 0, 0
	for _, p := range all {
		if !p.paid() {
			declined++
		}
		if p.twinOf != nil {
			twins++
		}
	}
	t.Logf("seed %d: %d tenants sharing %d keys: %d first uses, replayed; %d uses of keys other tenants had used "+
		"(%d with another tenant's body); %d declined; %d orders read by their tenant, %d reads refused to others; in %s",
		rnd.Seed(), len(tenants), len(tenantKeys), len(first), len(late), twins, declined, reads, refusals,
		time.Since(started).Round(time.Millisecond))
}

// tenantKeys are the Idempotency-Keys every tenant draws from: few, so that
// many tenants use each.
var tenantKeys = []string{"order-1", "order-2", "order-3", "order-4", "order-5", "order-6", "order-7", "order-8"}

// tenantClients is how many clients send checkouts at once.
const tenantClients = 16

// tenantRetryPause is how long a client waits before retrying after a
// connection error; tenantMaxRetryAfter caps the wait a 409's Retry-After
// asks for.
const (
	tenantRetryPause    = 20 * time.Millisecond
	tenantMaxRetryAfter = time.Second
)

// tenantNames returns n tenants in pairs whose names differ only in case:
// "tenant-00" and "TENANT-00" are two tenants.
func tenantNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%02d", i/2)
		if i%2 == 1 {
			names[i] = strings.ToUpper(names[i])
		}
	}
	return names
}

// caseTwin is the tenant whose name differs from tenants[i] only in case.
func caseTwin(tenants []string, i int) string { return tenants[i^1] }

// tenantPair is one tenant's use of one key: its request and, once sent,
// the first answer and the order and charge it names.
type tenantPair struct {
	tenant, key                    string
	customer, currency, card, body string
	amount                         int64
	twinOf                         *tenantPair // the pair whose body this one copies; nil for a body of its own
	answer                         tenantAnswer
	orderID, chargeID, orderStatus string
}

func (p *tenantPair) String() string { return p.tenant + "/" + p.key }
func (p *tenantPair) paid() bool     { return p.card != "tok_decline" }

// tenantPairs draws, for each key, two to half the tenants (plus one) that
// use it first, and then at least two of the others that use it later: the
// first of those with a body copied from one of the first users, the second
// with one of its own, the rest either way. Customer and amount are unique
// to each pair with a body of its own, so that an answer, an order or a
// charge given to the wrong pair shows.
func tenantPairs(rnd *faults.Source, tenants []string) (first, late []*tenantPair) {
	n, seq := len(tenants), 0
	for _, key := range tenantKeys {
		order := rnd.Perm(n)
		users := 2 + rnd.IntN(n/2)
		newcomers := 2 + rnd.IntN(n-users-1)
		keyFirst := make([]*tenantPair, 0, users)
		for _, i := range order[:users] {
			keyFirst = append(keyFirst, newTenantPair(rnd, tenants[i], key, seq))
			seq++
		}
		first = append(first, keyFirst...)
		for j, i := range order[users : users+newcomers] {
			if j == 0 || (j > 1 && rnd.IntN(3) == 0) {
				src := keyFirst[rnd.IntN(len(keyFirst))]
				twin := *src
				twin.tenant, twin.twinOf = tenants[i], src
				late = append(late, &twin)
				continue
			}
			late = append(late, newTenantPair(rnd, tenants[i], key, seq))
			seq++
		}
	}
	return first, late
}

func newTenantPair(rnd *faults.Source, tenant, key string, seq int) *tenantPair {
	currencies := []string{"usd", "eur", "gbp"}
	p := &tenantPair{tenant: tenant, key: key, customer: "cus_" + tenant + "_" + key,
		currency: currencies[seq%len(currencies)], amount: int64(1000 + 13*seq), card: "tok_visa"}
	if seq == 1 || rnd.IntN(5) == 0 {
		p.card = "tok_decline"
	}
	p.body = fmt.Sprintf(`{"customer_id":%q,"amount_cents":%d,"currency":%q,"card_token":%q,"items":[{"sku":"sku-%d","qty":%d}]}`,
		p.customer, p.amount, p.currency, p.card, seq, 1+seq%4)
	return p
}

// tenantAnswer is what a client got for a checkout, and how often it had
// to retry first.
type tenantAnswer struct {
	status                            int
	contentType, replayed, retryAfter string
	body                              []byte
	conflicts, connErrors             int
	err                               error
}

func tenantClient() *http.Client {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = tenantClients
	return &http.Client{Transport: transport, Timeout: 30 * time.Second}
}

// tenantSend posts every pair's checkout, tenantClients at a time in a
// seeded order, and returns the answers in the order of pairs. It only
// collects: the test goroutine checks.
func tenantSend(ctx context.Context, rnd *faults.Source, client *http.Client, base string, pairs []*tenantPair) []tenantAnswer {
	answers := make([]tenantAnswer, len(pairs))
	queue := make(chan int, len(pairs))
	for _, i := range rnd.Perm(len(pairs)) {
		queue <- i
	}
	close(queue)
	var wg sync.WaitGroup
	for range tenantClients {
		wg.Go(func() {
			for i := range queue {
				answers[i] = tenantCheckout(ctx, client, base, pairs[i])
			}
		})
	}
	wg.Wait()
	return answers
}

// tenantCheckout posts p until the answer is final: not a connection error
// and not a 409 (it waits as Retry-After says, at most
// tenantMaxRetryAfter).
func tenantCheckout(ctx context.Context, client *http.Client, base string, p *tenantPair) tenantAnswer {
	var conflicts, connErrors int
	for {
		a, err := tenantPost(ctx, client, base, p)
		pause := tenantRetryPause
		switch {
		case err != nil && ctx.Err() != nil:
			return tenantAnswer{err: fmt.Errorf("gave up after %d 409s and %d connection errors: %w", conflicts, connErrors, err)}
		case err != nil:
			connErrors++
		case a.status == http.StatusConflict:
			conflicts++
			if s, err := strconv.Atoi(a.retryAfter); err == nil {
				pause = min(time.Duration(s)*time.Second, tenantMaxRetryAfter)
			}
		default:
			a.conflicts, a.connErrors = conflicts, connErrors
			return a
		}
		timer := time.NewTimer(pause)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
		}
	}
}

func tenantPost(ctx context.Context, client *http.Client, base string, p *tenantPair) (tenantAnswer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/checkouts", strings.NewReader(p.body))
	if err != nil {
		return tenantAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", p.key)
	authorize(req, p.tenant)
	resp, err := client.Do(req)
	if err != nil {
		return tenantAnswer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return tenantAnswer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"),
		replayed: resp.Header.Get("Idempotent-Replayed"), retryAfter: resp.Header.Get("Retry-After"), body: body}, err
}

// tenantSettle records each pair's first answer and checks that it is the
// pair's own execution: not a replay, and no 409 on the way, since no other
// request used the pair's record (only a retry after a connection error may
// find its own earlier attempt running, or finished); and its own answer: a
// paid order of its own amount and currency, or a 402 for a declined card.
func tenantSettle(t *testing.T, pairs []*tenantPair, answers []tenantAnswer) {
	t.Helper()
	for i, p := range pairs {
		a := answers[i]
		require.NoError(t, a.err, "pair %s", p)
		p.answer = a
		if a.connErrors == 0 {
			require.Empty(t, a.replayed, "pair %s: its first answer is a replay of another execution: %s", p, a.body)
			require.Zero(t, a.conflicts, "pair %s: another request held its record", p)
		}
		if p.paid() {
			tenantCheckPaid(t, p)
		} else {
			tenantCheckDeclined(t, p)
		}
	}
}

// tenantCheckReplays checks that sending a pair again replays its first
// answer byte for byte.
func tenantCheckReplays(t *testing.T, pairs []*tenantPair, answers []tenantAnswer) {
	t.Helper()
	for i, p := range pairs {
		a := answers[i]
		require.NoError(t, a.err, "pair %s", p)
		require.Equal(t, p.answer.status, a.status, "pair %s: %s", p, a.body)
		require.Equal(t, string(p.answer.body), string(a.body), "pair %s: a retry gets the pair's own first answer", p)
		require.Equal(t, p.answer.contentType, a.contentType, "pair %s", p)
		require.Equal(t, "true", a.replayed, "pair %s", p)
	}
}

// tenantDeclined is the detail of a declined checkout's 402.
var tenantDeclined = regexp.MustCompile(`^the card was declined; order (ord_[0-9a-f]{16}) is not paid$`)

// tenantCheckDistinct checks that no two pairs share an order or a charge.
func tenantCheckDistinct(t *testing.T, pairs []*tenantPair) {
	t.Helper()
	orders, charges := map[string]*tenantPair{}, map[string]*tenantPair{}
	for _, p := range pairs {
		require.NotContains(t, orders, p.orderID, "pairs %s and %s got one order", orders[p.orderID], p)
		orders[p.orderID] = p
		if p.paid() {
			require.NotContains(t, charges, p.chargeID, "pairs %s and %s got one charge", charges[p.chargeID], p)
			charges[p.chargeID] = p
		}
	}
}

type tenantPaid struct {
	OrderID     string `json:"order_id"`
	ChargeID    string `json:"charge_id"`
	Status      string `json:"status"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

func tenantCheckPaid(t *testing.T, p *tenantPair) {
	t.Helper()
	require.Equal(t, http.StatusCreated, p.answer.status, "pair %s: %s", p, p.answer.body)
	require.Equal(t, "application/json", p.answer.contentType, "pair %s", p)
	var paid tenantPaid
	require.NoError(t, json.Unmarshal(p.answer.body, &paid), "pair %s", p)
	require.Equal(t, tenantPaid{OrderID: paid.OrderID, ChargeID: paid.ChargeID, Status: "paid", AmountCents: p.amount, Currency: p.currency},
		paid, "pair %s: the answer names its own amount and currency", p)
	require.NotEmpty(t, paid.OrderID, "pair %s", p)
	require.NotEmpty(t, paid.ChargeID, "pair %s", p)
	p.orderID, p.chargeID, p.orderStatus = paid.OrderID, paid.ChargeID, "paid"
}

func tenantCheckDeclined(t *testing.T, p *tenantPair) {
	t.Helper()
	require.Equal(t, http.StatusPaymentRequired, p.answer.status, "pair %s: %s", p, p.answer.body)
	require.Equal(t, "application/problem+json", p.answer.contentType, "pair %s", p)
	var problem struct {
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	require.NoError(t, json.Unmarshal(p.answer.body, &problem), "pair %s", p)
	require.Equal(t, http.StatusPaymentRequired, problem.Status, "pair %s", p)
	m := tenantDeclined.FindStringSubmatch(problem.Detail)
	require.NotNil(t, m, "pair %s: %s", p, p.answer.body)
	p.orderID, p.orderStatus = m[1], "declined"
}

// tenantOrder is what GET /v1/orders/{order_id} answers, but for the
// receipt, which the sweeper sends when it will.
type tenantOrder struct {
	OrderID     string  `json:"order_id"`
	CustomerID  string  `json:"customer_id"`
	Status      string  `json:"status"`
	ChargeID    *string `json:"charge_id"`
	AmountCents int64   `json:"amount_cents"`
	Currency    string  `json:"currency"`
}

func (p *tenantPair) order() tenantOrder {
	o := tenantOrder{OrderID: p.orderID, CustomerID: p.customer, Status: p.orderStatus, AmountCents: p.amount, Currency: p.currency}
	if p.paid() {
		o.ChargeID = &p.chargeID
	}
	return o
}

// tenantCheckReads reads every pair's order as its tenant, which gets it,
// and as the other tenants that used the same key, the tenant whose name
// differs only in case and one more drawn at random, which get the 404 an
// order that does not exist gets (getOrder: "no such order"), byte for
// byte. It returns how many reads it made of each kind.
func tenantCheckReads(t *testing.T, e *env, rnd *faults.Source, base string, tenants []string, pairs []*tenantPair) (reads, refusals int) {
	t.Helper()
	notFound := workflow.Problem(http.StatusNotFound, "no such order")
	refused := func(res call, what string) {
		t.Helper()
		require.Equal(t, notFound.Status, res.status, "%s: %s", what, res.body)
		require.Equal(t, "application/problem+json", res.header.Get("Content-Type"), what)
		require.Equal(t, string(notFound.Body), res.body, what)
	}
	refused(e.do(http.MethodGet, base+"/v1/orders/ord_0000000000000000", "", tenants[0], ""), "an order that does not exist")
	users := map[string][]string{}
	for _, p := range pairs {
		users[p.key] = append(users[p.key], p.tenant)
	}
	for _, p := range pairs {
		url := base + "/v1/orders/" + p.orderID
		res := e.do(http.MethodGet, url, "", p.tenant, "")
		require.Equal(t, http.StatusOK, res.status, "pair %s reads its order: %s", p, res.body)
		var got tenantOrder
		require.NoError(t, json.Unmarshal([]byte(res.body), &got), "pair %s", p)
		require.Equal(t, p.order(), got, "pair %s reads its own order", p)
		reads++

		i := slices.Index(tenants, p.tenant)
		others := append(slices.Clone(users[p.key]), caseTwin(tenants, i), tenants[(i+1+rnd.IntN(len(tenants)-1))%len(tenants)])
		slices.Sort(others)
		for _, other := range slices.Compact(others) {
			if other != p.tenant {
				refused(e.do(http.MethodGet, url, "", other, ""), fmt.Sprintf("tenant %s reads the order of pair %s", other, p))
				refusals++
			}
		}
	}
	return reads, refusals
}

func tenantConnect(t *testing.T, e *env) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(e.ctx, e.dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// tenantRecord is a key record as the database holds it.
type tenantRecord struct {
	id                      uuid.UUID
	status                  string
	responseStatus          int
	responseBody            []byte
	contentType, stateOrder string
}

func tenantRecords(t *testing.T, conn *pgx.Conn) map[recovery.Key]tenantRecord {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		SELECT tenant_id, key, id, status, coalesce(response_status, 0), coalesce(response_body, ''),
		       coalesce(response_header->'Content-Type'->>0, ''), coalesce(state->>'order_id', '')
		FROM onceflow_keys`)
	require.NoError(t, err)
	records := map[recovery.Key]tenantRecord{}
	var (
		k recovery.Key
		r tenantRecord
	)
	_, err = pgx.ForEachRow(rows, []any{&k.Tenant, &k.ID, &r.id, &r.status, &r.responseStatus, &r.responseBody,
		&r.contentType, &r.stateOrder}, func() error {
		r.responseBody = bytes.Clone(r.responseBody)
		records[k] = r
		return nil
	})
	require.NoError(t, err)
	return records
}

// tenantCheckRecords checks onceflow_keys: one completed record per pair
// and no other, under the pair's own tenant, storing the answer its client
// got and naming its order.
func tenantCheckRecords(t *testing.T, pairs []*tenantPair, records map[recovery.Key]tenantRecord) {
	t.Helper()
	require.Len(t, records, len(pairs), "one key record per pair, and no other")
	for _, p := range pairs {
		r, ok := records[recovery.Key{Tenant: p.tenant, ID: p.key}]
		require.True(t, ok, "pair %s has no record under its tenant", p)
		require.Equal(t, "completed", r.status, "pair %s", p)
		require.Equal(t, p.answer.status, r.responseStatus, "pair %s", p)
		require.Equal(t, string(p.answer.body), string(r.responseBody), "pair %s: the stored response is the answer", p)
		require.Equal(t, p.answer.contentType, r.contentType, "pair %s", p)
		require.Equal(t, p.orderID, r.stateOrder, "pair %s: its record names its order", p)
	}
}

// tenantOrderRow is a row of checkout_orders.
type tenantOrderRow struct {
	tenant, customer, currency, status, chargeID string
	amount                                       int64
}

// tenantCheckOrders checks checkout_orders: one order per pair and no
// other, under the pair's tenant, for its customer, amount and currency.
func tenantCheckOrders(t *testing.T, conn *pgx.Conn, pairs []*tenantPair) {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		SELECT id, tenant_id, customer_id, amount_cents, currency, status, coalesce(charge_id, '') FROM checkout_orders`)
	require.NoError(t, err)
	orders := map[string]tenantOrderRow{}
	var (
		id string
		o  tenantOrderRow
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &o.tenant, &o.customer, &o.amount, &o.currency, &o.status, &o.chargeID},
		func() error { orders[id] = o; return nil })
	require.NoError(t, err)
	require.Len(t, orders, len(pairs), "one order per pair, and no other")
	for _, p := range pairs {
		require.Equal(t, tenantOrderRow{tenant: p.tenant, customer: p.customer, currency: p.currency, status: p.orderStatus,
			chargeID: p.chargeID, amount: p.amount}, orders[p.orderID], "pair %s: its order", p)
	}
}

// tenantCheckCharges checks the provider: one charge per paid pair and no
// other, made under the downstream key derived from the pair's tenant, key
// and record, for the pair's amount, and named in its answer; a declined
// pair has none. The downstream keys of one client key differ across
// tenants.
func tenantCheckCharges(t *testing.T, charges []Charge, pairs []*tenantPair, records map[recovery.Key]tenantRecord) {
	t.Helper()
	byKey := map[string]Charge{}
	for _, ch := range charges {
		require.NotContains(t, byKey, ch.IdempotencyKey, "two charges share a downstream key: %+v", ch)
		byKey[ch.IdempotencyKey] = ch
	}
	paid := 0
	downstream := map[string]*tenantPair{} // downstream key → pair
	for _, p := range pairs {
		k := recovery.Key{Tenant: p.tenant, ID: p.key}
		dk := foreign.DeriveKey(k, records[k].id, "charge")
		require.NotContains(t, downstream, dk, "pairs %s and %s derive one downstream key", downstream[dk], p)
		downstream[dk] = p
		ch, ok := byKey[dk]
		if !p.paid() {
			require.False(t, ok, "pair %s: a declined card made a charge: %+v", p, ch)
			continue
		}
		paid++
		require.True(t, ok, "pair %s: no charge under its downstream key", p)
		require.Equal(t, Charge{ID: p.chargeID, IdempotencyKey: dk, AmountCents: p.amount, Currency: p.currency}, ch,
			"pair %s: its charge", p)
	}
	require.Len(t, charges, paid, "one charge per paid pair, and no other")
}
