package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/recovery"
)

// binary is the checkout command, built once for the tests: the app and the
// provider run as real processes. onceflowBinary is the onceflow command,
// for the tests of what an operator does next to the service.
var binary, onceflowBinary string

func TestMain(m *testing.M) {
	dbtest.MainWithBuilds(m, dbtest.Build{Pkg: ".", Name: "checkout", Path: &binary},
		dbtest.Build{Pkg: "../../cmd/onceflow", Name: "onceflow", Path: &onceflowBinary})
}

// env is one test's database and payment provider process.
type env struct {
	t        *testing.T
	ctx      context.Context
	dbURL    string
	provider string
	// tenants have an API key (apiKeyOf) in the file serve passes as
	// --api-keys; set it before serve to have others.
	tenants []string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	t.Parallel()
	e := &env{t: t, ctx: context.Background(), dbURL: dbtest.NewDatabase(t, dbtest.Options{}), tenants: []string{"acme", "globex"}}
	cmd := exec.Command(binary, "provider", "--addr", "127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	e.provider = strings.TrimSpace(strings.TrimPrefix(line, "listening on "))
	return e
}

// serve starts a checkout server process that authenticates by API key
// (each of e.tenants has one: tenantKey), with args after the common ones.
func (e *env) serve(args ...string) *serveProcess {
	e.t.Helper()
	var keys strings.Builder
	for _, tenant := range e.tenants {
		fmt.Fprintf(&keys, "%s %s\n", apiKeyOf(tenant), tenant)
	}
	file := filepath.Join(e.t.TempDir(), "api-keys")
	require.NoError(e.t, os.WriteFile(file, []byte(keys.String()), 0o600))
	return e.serveWith(append([]string{"--api-keys", file}, args...)...)
}

// apiKeyOf is the API key the tests give tenant.
func apiKeyOf(tenant string) string { return "test-api-key-of-" + tenant }

// authorize makes req tenant's, by its API key; "" leaves it without one.
func authorize(req *http.Request, tenant string) {
	if tenant != "" {
		req.Header.Set("Authorization", "Bearer "+apiKeyOf(tenant))
	}
}

// serveWith starts a checkout server process with the database, the
// provider and args, and no more.
func (e *env) serveWith(args ...string) *serveProcess {
	e.t.Helper()
	p, err := startServe(e.ctx, binary, append([]string{"--database-url", e.dbURL, "--provider-url", e.provider}, args...)...)
	require.NoError(e.t, err)
	e.t.Cleanup(func() {
		select {
		case <-p.Done():
		default:
			p.Stop()
		}
	})
	return p
}

type call struct {
	status int
	header http.Header
	body   string
}

func (e *env) do(method, url, key, tenant, body string) call {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, method, url, strings.NewReader(body))
	require.NoError(e.t, err)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	authorize(req, tenant)
	req.Header.Set("Content-Type", "application/json")
	return e.send(req)
}

// send sends req and reads the answer.
func (e *env) send(req *http.Request) call {
	e.t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return call{resp.StatusCode, resp.Header, string(b)}
}

func (e *env) checkout(p *serveProcess, key, body string) call {
	e.t.Helper()
	return e.do(http.MethodPost, p.URL+"/v1/checkouts", key, "acme", body)
}

func (e *env) charges() []Charge {
	e.t.Helper()
	var charges []Charge
	require.NoError(e.t, json.Unmarshal([]byte(e.do(http.MethodGet, e.provider+"/charges", "", "", "").body), &charges))
	return charges
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	conn, err := pgx.Connect(e.ctx, e.dbURL)
	require.NoError(e.t, err)
	defer conn.Close(e.ctx)
	var n int
	require.NoError(e.t, conn.QueryRow(e.ctx, sql, args...).Scan(&n))
	return n
}

const order = `{"customer_id":"cus_1","amount_cents":4200,"currency":"usd","card_token":"tok_visa","items":[{"sku":"book","qty":1}]}`

var ids = regexp.MustCompile(`"(ord|ch)_[0-9a-f]+"`)

// normalized blanks the generated identifiers, for comparing responses of
// different runs.
func normalized(body string) string { return ids.ReplaceAllString(body, `"$1_…"`) }

func TestCheckoutStatusCodes(t *testing.T) {
	e := newEnv(t)
	app := e.serve()

	first := e.checkout(app, "k-1", order)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	var paid struct {
		OrderID     string `json:"order_id"`
		ChargeID    string `json:"charge_id"`
		Status      string `json:"status"`
		AmountCents int64  `json:"amount_cents"`
	}
	require.NoError(t, json.Unmarshal([]byte(first.body), &paid))
	require.Equal(t, "paid", paid.Status)
	require.Equal(t, int64(4200), paid.AmountCents)

	replay := e.checkout(app, "k-1", strings.ReplaceAll(order, `"amount_cents":4200`, `"amount_cents":42e2`))
	require.Equal(t, first.body, replay.body, "a replay is byte-identical, whatever the JSON spelling")
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))

	problem := func(c call, status int) {
		t.Helper()
		require.Equal(t, status, c.status, c.body)
		require.Equal(t, "application/problem+json", c.header.Get("Content-Type"), c.body)
	}
	problem(e.checkout(app, "k-1", strings.Replace(order, "4200", "4300", 1)), http.StatusUnprocessableEntity)
	problem(e.do(http.MethodPost, app.URL+"/v1/checkouts", "", "acme", order), http.StatusBadRequest)
	problem(e.do(http.MethodPost, app.URL+"/v1/checkouts", strings.Repeat("k", 256), "acme", order), http.StatusBadRequest)
	problem(e.do(http.MethodPost, app.URL+"/v1/checkouts", "k-2", "", order), http.StatusUnauthorized)
	problem(e.checkout(app, "k-3", `{"customer_id":`), http.StatusBadRequest)
	problem(e.checkout(app, "k-4", strings.Replace(order, `"amount_cents":4200`, `"amount_cents":0`, 1)), http.StatusUnprocessableEntity)
	problem(e.checkout(app, "k-5", strings.Replace(order, `"usd"`, `"doubloons"`, 1)), http.StatusUnprocessableEntity)
	problem(e.checkout(app, "k-6", `{"customer_id":"c","amount_cents":1,"currency":"usd","card_token":"tok_visa","items":[{"sku":"`+
		strings.Repeat("x", 2<<20)+`","qty":1}]}`), http.StatusRequestEntityTooLarge)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM onceflow_keys`), "no record for rejected requests")

	declined := e.checkout(app, "k-7", strings.Replace(order, "tok_visa", "tok_decline", 1))
	problem(declined, http.StatusPaymentRequired)
	again := e.checkout(app, "k-7", strings.Replace(order, "tok_visa", "tok_decline", 1))
	require.Equal(t, declined.body, again.body, "a declined card is stored and replayed")
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM checkout_orders WHERE status = 'declined'`))

	got := e.do(http.MethodGet, app.URL+"/v1/orders/"+paid.OrderID, "", "acme", "")
	require.Equal(t, http.StatusOK, got.status)
	require.Contains(t, got.body, `"status":"paid"`)
	require.Contains(t, got.body, `"charge_id":"`+paid.ChargeID+`"`)
	problem(e.do(http.MethodGet, app.URL+"/v1/orders/"+paid.OrderID, "", "globex", ""), http.StatusNotFound)
	problem(e.do(http.MethodGet, app.URL+"/v1/orders/"+paid.OrderID, "", "", ""), http.StatusUnauthorized)
	require.Len(t, e.charges(), 1)
}

// TestReceiptIsSentOnce: the receipt goes through the outbox and the
// sweeper's relay; the order shows it sent.
func TestReceiptIsSentOnce(t *testing.T) {
	e := newEnv(t)
	app := e.serve("--sweep-every", "1s")
	first := e.checkout(app, "k-1", order)
	require.Equal(t, http.StatusCreated, first.status)
	var paid struct {
		OrderID string `json:"order_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(first.body), &paid))
	require.Eventually(t, func() bool {
		return strings.Contains(e.do(http.MethodGet, app.URL+"/v1/orders/"+paid.OrderID, "", "acme", "").body, `"receipt_sent":true`)
	}, time.Minute, 100*time.Millisecond, "the relay runs every second")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM checkout_receipts`))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM onceflow_outbox WHERE status = 'delivered'`))
}

// TestConcurrentDuplicatesChargeOnce: 50 identical requests at once make one
// charge; every answer is the 201, byte for byte, or a 409.
func TestConcurrentDuplicatesChargeOnce(t *testing.T) {
	e := newEnv(t)
	app := e.serve()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		answers = map[int]map[string]int{}
		start   = make(chan struct{})
	)
	for range 50 {
		wg.Go(func() {
			<-start
			req, _ := http.NewRequest(http.MethodPost, app.URL+"/v1/checkouts", strings.NewReader(order))
			req.Header.Set("Idempotency-Key", "same")
			authorize(req, "acme")
			resp, err := http.DefaultClient.Do(req)
			status, body := -1, ""
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				status, body = resp.StatusCode, string(b)
				if status == http.StatusConflict && resp.Header.Get("Retry-After") == "" {
					status = -2 // a 409 must say when to retry
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if answers[status] == nil {
				answers[status] = map[string]int{}
			}
			answers[status][body]++
		})
	}
	close(start)
	wg.Wait()
	for status := range answers {
		require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, status, "answers: %v", answers)
	}
	require.Len(t, answers[http.StatusCreated], 1, "every 201 is the same bytes: %v", answers[http.StatusCreated])
	require.Len(t, e.charges(), 1)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM checkout_orders`))
}

// TestCrashAfterEachStep: the server dies right after each step; a retry on
// a restarted server gives one order, one charge, and the response an
// uncrashed checkout gives.
func TestCrashAfterEachStep(t *testing.T) {
	base := newEnv(t)
	uncrashed := normalized(base.checkout(base.serve(), "uncrashed", order).body)
	require.Contains(t, uncrashed, `"status":"paid"`)
	for _, step := range []string{"create_order", "charge", "record_charge"} {
		t.Run(step, func(t *testing.T) {
			e := newEnv(t)
			crashing := e.serve("--crash-after", step, "--lease", "1s")
			requireNoAnswer(t, mustRequest(t, crashing.URL, "k-1"))
			require.Equal(t, crashExitCode, crashing.Wait())

			app := e.serve("--lease", "1s")
			var res call
			require.Eventually(t, func() bool {
				res = e.checkout(app, "k-1", order)
				return res.status != http.StatusConflict // the dead server's lease runs out within a second
			}, 30*time.Second, 50*time.Millisecond)
			require.Equal(t, http.StatusCreated, res.status, res.body)
			require.Equal(t, uncrashed, normalized(res.body))
			require.Equal(t, 1, e.count(`SELECT count(*) FROM checkout_orders`))
			require.Equal(t, 1, e.count(`SELECT count(*) FROM checkout_orders WHERE status = 'paid'`))
			charges := e.charges()
			require.Len(t, charges, 1)
			require.Contains(t, res.body, `"charge_id":"`+charges[0].ID+`"`)

			replay := e.checkout(app, "k-1", order)
			require.Equal(t, res.body, replay.body)
		})
	}
}

func mustRequest(t *testing.T, base, key string) *http.Request {
	req, err := http.NewRequest(http.MethodPost, base+"/v1/checkouts", strings.NewReader(order))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", key)
	authorize(req, "acme")
	return req
}

// TestSweeperFinishesAbandonedCheckout: the server dies after the charge
// and the client never retries; the restarted server's sweeper finishes the
// checkout, and a late retry gets the replay.
// requireNoAnswer sends req to a server that must die before answering.
func requireNoAnswer(t *testing.T, req *http.Request) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	require.Error(t, err, "the server died before answering")
}

func TestSweeperFinishesAbandonedCheckout(t *testing.T) {
	e := newEnv(t)
	crashing := e.serve("--crash-after", "charge", "--lease", "1s")
	requireNoAnswer(t, mustRequest(t, crashing.URL, "k-1"))
	require.Equal(t, crashExitCode, crashing.Wait())

	app := e.serve("--lease", "1s", "--sweep-every", "1s")
	require.Eventually(t, func() bool {
		return e.count(`SELECT count(*) FROM onceflow_keys WHERE status = 'completed'`) == 1
	}, time.Minute, 100*time.Millisecond, "the sweeper completes the checkout on its own")
	late := e.checkout(app, "k-1", order)
	require.Equal(t, http.StatusCreated, late.status)
	require.Equal(t, "true", late.header.Get("Idempotent-Replayed"))
	require.Len(t, e.charges(), 1)
	store, err := recovery.New(mustPool(t, e), recovery.Config{})
	require.NoError(t, err)
	rec, err := store.Load(e.ctx, recovery.Key{Tenant: "acme", ID: "k-1"})
	require.NoError(t, err)
	require.Equal(t, 1, rec.Attempts, "the dead attempt is counted")
}

func mustPool(t *testing.T, e *env) recovery.DBTX {
	return dbtest.Connect(t, e.dbURL, 2)
}

// TestStorageUnreachableFailsClosed: with the database gone, checkouts are
// 503 and nothing is charged.
func TestStorageUnreachableFailsClosed(t *testing.T) {
	e := newEnv(t)
	app := e.serve()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("checkout serve log:\n%s", app.Stderr())
		}
	})
	setConnections(t, e, false) // the database becomes unreachable
	t.Cleanup(func() { setConnections(t, e, true) })

	res := e.checkout(app, "k-1", order)
	require.Equal(t, http.StatusServiceUnavailable, res.status, res.body)
	require.Equal(t, "application/problem+json", res.header.Get("Content-Type"))
	require.Empty(t, e.charges(), "the workflow did not run")
}

// setConnections lets connections to the test database in, or keeps them
// out and ends the open ones.
func setConnections(t *testing.T, e *env, allow bool) {
	cfg, err := pgx.ParseConfig(e.dbURL)
	require.NoError(t, err)
	name := cfg.Database
	cfg.Database = "postgres"
	conn, err := pgx.ConnectConfig(e.ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(e.ctx)
	_, err = conn.Exec(e.ctx, fmt.Sprintf(`ALTER DATABASE %s ALLOW_CONNECTIONS %t`, pgx.Identifier{name}.Sanitize(), allow))
	require.NoError(t, err)
	if !allow {
		_, err = conn.Exec(e.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, name)
		require.NoError(t, err)
	}
}

func TestProviderContract(t *testing.T) {
	e := newEnv(t)
	charge := `{"amount_cents":100,"currency":"usd","card_token":"tok_visa"}`
	first := e.do(http.MethodPost, e.provider+"/charges", "pk-1", "", charge)
	require.Equal(t, http.StatusCreated, first.status)
	require.Regexp(t, `^\{"id":"ch_\d+","amount_cents":100,"currency":"usd"\}$`, first.body)
	require.Equal(t, first, e.do(http.MethodPost, e.provider+"/charges", "pk-1", "", charge), "the same key, the same charge")
	require.Equal(t, http.StatusUnprocessableEntity, e.do(http.MethodPost, e.provider+"/charges", "pk-1", "",
		`{"amount_cents":101,"currency":"usd","card_token":"tok_visa"}`).status)
	require.Equal(t, http.StatusPaymentRequired, e.do(http.MethodPost, e.provider+"/charges", "pk-2", "",
		`{"amount_cents":100,"currency":"usd","card_token":"tok_decline"}`).status)
	require.Equal(t, http.StatusBadRequest, e.do(http.MethodPost, e.provider+"/charges", "", "", charge).status)
	charges := e.charges()
	require.Len(t, charges, 1)
	require.Equal(t, "pk-1", charges[0].IdempotencyKey)
}

// TestInFlightIsConflict: a checkout whose server died holds its key until
// the lease runs out; a retry meanwhile is 409 with Retry-After.
func TestInFlightIsConflict(t *testing.T) {
	e := newEnv(t)
	crashing := e.serve("--crash-after", "charge", "--lease", "30s")
	requireNoAnswer(t, mustRequest(t, crashing.URL, "k-1"))
	require.Equal(t, crashExitCode, crashing.Wait())
	app := e.serve()
	res := e.checkout(app, "k-1", order)
	require.Equal(t, http.StatusConflict, res.status, res.body)
	require.Equal(t, "application/problem+json", res.header.Get("Content-Type"))
	require.NotEmpty(t, res.header.Get("Retry-After"))
}

// TestDemo runs the README's first command's program: it must tell its
// story and exit 0.
func TestDemo(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(binary, "demo")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, line := range []string{
		"the server exited with code 3",
		`recovery point "create_order"`,
		"→ 201",
		"1 order, 1 charge",
		"Idempotent-Replayed: true, identical bytes: true",
	} {
		require.Contains(t, string(out), line)
	}
}

// TestFailedStepIs500AndResumes: with the provider down, the charge fails:
// 500, the order kept at its recovery point; once the provider is back, the
// retry resumes and charges once.
func TestFailedStepIs500AndResumes(t *testing.T) {
	e := newEnv(t)
	down := e.serve("--provider-url", "http://127.0.0.1:1") // nothing listens there
	res := e.checkout(down, "k-1", order)
	require.Equal(t, http.StatusInternalServerError, res.status, res.body)
	require.Equal(t, "application/problem+json", res.header.Get("Content-Type"))
	require.Contains(t, res.body, "retry with the same key to resume")
	down.Stop()

	app := e.serve()
	ok := e.checkout(app, "k-1", order)
	require.Equal(t, http.StatusCreated, ok.status, ok.body)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM checkout_orders`), "the retry resumed after create_order")
	require.Len(t, e.charges(), 1)
}

func TestCrashAfterNeedsADatabaseThatOutlivesIt(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(binary, "serve", "--crash-after", "charge").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "--crash-after needs --database-url and --provider-url")
}
