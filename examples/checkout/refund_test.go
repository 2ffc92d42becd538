package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// mischarged is an order whose card the provider charges one cent too much.
var mischarged = strings.Replace(order, "tok_visa", tokWrongAmount, 1)

// TestRefundOfAChargeNeverMadeIsNothingToUndo: charge's compensation
// succeeds when the provider made no charge with the step's key (its
// request timed out before it arrived), and the late charge is refused.
func TestRefundOfAChargeNeverMadeIsNothingToUndo(t *testing.T) {
	t.Parallel()
	p := newProvider()
	srv := httptest.NewServer(p.routes())
	t.Cleanup(srv.Close)
	a := &app{provider: srv.URL, client: srv.Client(), logger: slog.New(slog.DiscardHandler)}
	c := &foreign.Call[CheckoutRequest, CheckoutState]{Run: &phase.Run[CheckoutRequest, CheckoutState]{}, Key: "rk-1", Compensates: "pk-late"}
	require.NoError(t, a.refund(context.Background(), c))
	require.NoError(t, a.refund(context.Background(), c), "the refund again, with its key")

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount_cents":1,"currency":"usd","card_token":"tok_visa"}`))
	require.NoError(t, err)
	foreign.SetHeader(req, "pk-late")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusConflict, resp.StatusCode, "a charge refunded before it arrived is refused")
	charges, _ := p.counts()
	require.Zero(t, charges)
}

// requireRefunded checks that the checkout under key ended compensated:
// its order cancelled, the one charge the provider made refunded once,
// under the compensation's own derived key, and no receipt queued.
func requireRefunded(t *testing.T, e *env, key string) {
	t.Helper()
	store, err := recovery.New(mustPool(t, e), recovery.Config{})
	require.NoError(t, err)
	rec, err := store.Load(e.ctx, recovery.Key{Tenant: "acme", ID: key})
	require.NoError(t, err)
	require.Equal(t, recovery.StatusCompensated, rec.Status)
	require.Empty(t, rec.Undo)

	charges := e.charges()
	require.Len(t, charges, 1)
	require.Equal(t, int64(4201), charges[0].AmountCents)
	require.NotNil(t, charges[0].Refund, "the charge is refunded")
	require.Equal(t, foreign.DeriveKey(rec.Key, rec.ID, "charge", "compensate"), charges[0].Refund.IdempotencyKey)
	require.Equal(t, foreign.DeriveKey(rec.Key, rec.ID, "charge"), charges[0].IdempotencyKey)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM checkout_orders WHERE status = 'cancelled' AND charge_id = $1`, charges[0].ID))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM checkout_orders`))
	require.Zero(t, e.count(`SELECT count(*) FROM onceflow_outbox`), "no receipt for a cancelled order")
}

// TestMischargedCheckoutIsRefunded: the provider charges another amount
// than the order's; record_charge cancels the order and aborts before the
// point of no return, so the charge is refunded, once, and the answer is a
// stored 502 that a retry replays.
func TestMischargedCheckoutIsRefunded(t *testing.T) {
	e := newEnv(t)
	app := e.serve()
	res := e.checkout(app, "k-1", mischarged)
	require.Equal(t, http.StatusBadGateway, res.status, res.body)
	require.Equal(t, "application/problem+json", res.header.Get("Content-Type"))
	require.Contains(t, res.body, "the payment provider charged 4201 usd for order ord_")
	require.Contains(t, res.body, "the charge is refunded and the order is cancelled")

	replay := e.checkout(app, "k-1", mischarged)
	require.Equal(t, res.body, replay.body)
	require.Equal(t, http.StatusBadGateway, replay.status)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	requireRefunded(t, e, "k-1")

	var order struct {
		Status string `json:"status"`
	}
	id := regexp.MustCompile(`ord_[0-9a-f]+`).FindString(res.body)
	got := e.do(http.MethodGet, app.URL+"/v1/orders/"+id, "", "acme", "")
	require.Equal(t, http.StatusOK, got.status, got.body)
	require.NoError(t, json.Unmarshal([]byte(got.body), &order))
	require.Equal(t, "cancelled", order.Status)
}

// TestCrashDuringRefundRefundsOnce: the server dies at each point of the
// refund; a retry on a restarted server finishes the compensation with the
// same refund key, so the provider refunds once, and answers the 502.
func TestCrashDuringRefundRefundsOnce(t *testing.T) {
	t.Parallel()
	for _, point := range []string{"before undoing charge", "after charge's compensation call", "after charge's compensation commit"} {
		t.Run(point, func(t *testing.T) {
			e := newEnv(t)
			crashing := e.serve("--crash-at", point, "--lease", "1s")
			req, err := http.NewRequest(http.MethodPost, crashing.URL+"/v1/checkouts", strings.NewReader(mischarged))
			require.NoError(t, err)
			req.Header.Set("Idempotency-Key", "k-1")
			authorize(req, "acme")
			requireNoAnswer(t, req)
			require.Equal(t, crashExitCode, crashing.Wait())

			app := e.serve("--lease", "1s")
			var res call
			require.Eventually(t, func() bool {
				res = e.checkout(app, "k-1", mischarged)
				return res.status != http.StatusConflict // the dead server's lease runs out within a second
			}, 30*time.Second, 50*time.Millisecond)
			require.Equal(t, http.StatusBadGateway, res.status, res.body)
			require.Contains(t, res.body, "the charge is refunded and the order is cancelled")
			requireRefunded(t, e, "k-1")
			require.Equal(t, res.body, e.checkout(app, "k-1", mischarged).body)
		})
	}
}

// TestPaidAndDeclinedAreNotRefunded: a paid checkout and a declined one
// end completed, with nothing refunded.
func TestPaidAndDeclinedAreNotRefunded(t *testing.T) {
	e := newEnv(t)
	app := e.serve()
	require.Equal(t, http.StatusCreated, e.checkout(app, "k-1", order).status)
	require.Equal(t, http.StatusPaymentRequired, e.checkout(app, "k-2", strings.Replace(order, "tok_visa", tokDecline, 1)).status)
	charges := e.charges()
	require.Len(t, charges, 1)
	require.Nil(t, charges[0].Refund)
	require.Equal(t, 2, e.count(`SELECT count(*) FROM onceflow_keys WHERE status = 'completed'`))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM checkout_orders WHERE status = 'paid'`))
}

// TestCrashAtNamesACrashPoint: --crash-at takes a crash point by its name,
// the refund's included, and lists them when given another; like
// --crash-after, it needs a database and a provider that outlive it.
func TestCrashAtNamesACrashPoint(t *testing.T) {
	e := newEnv(t)
	out, err := exec.Command(binary, "serve", "--crash-at", "nope").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "--crash-at needs --database-url and --provider-url")
	out, err = exec.Command(binary, "serve", "--database-url", e.dbURL, "--provider-url", e.provider, "--crash-at", "nope").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), `--crash-at "nope": the crash points are "before create_order", `)
	require.Contains(t, string(out), `"after charge's compensation call"`)
}

// TestRefundOutlivesRetriesDuringAProviderOutage: the provider answers 503
// to every refund for a while, and the client retries at once, again and
// again, more times than a compensation has attempts. The refund must not
// fail for good (a charge kept, the stored 502 turned into a 500): each
// failed try defers the key, the retries meanwhile are told to wait, and
// once the provider is back the charge is refunded once and the 502
// answered.
func TestRefundOutlivesRetriesDuringAProviderOutage(t *testing.T) {
	e := newEnv(t)
	target, err := url.Parse(e.provider)
	require.NoError(t, err)
	var outage atomic.Bool
	outage.Store(true)
	forward := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/refunds" && outage.Load() {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	e.provider = proxy.URL
	app := e.serve("--lease", "2s")

	var during []call
	for range 2 * workflow.MaxAttemptsDefault {
		during = append(during, e.checkout(app, "k-1", mischarged))
	}
	require.Zero(t, e.count(`SELECT count(*) FROM onceflow_keys WHERE status <> 'in_flight'`),
		"the refund failed for good during a short outage: %s", during[len(during)-1].body)
	for i, res := range during {
		require.Contains(t, []int{http.StatusServiceUnavailable, http.StatusConflict}, res.status, "retry %d: %s", i, res.body)
		require.NotEmpty(t, res.header.Get("Retry-After"), "retry %d", i)
	}

	outage.Store(false)
	var res call
	require.Eventually(t, func() bool {
		res = e.checkout(app, "k-1", mischarged)
		return res.status != http.StatusConflict && res.status != http.StatusServiceUnavailable
	}, 30*time.Second, 100*time.Millisecond)
	require.Equal(t, http.StatusBadGateway, res.status, res.body)
	require.Contains(t, res.body, "the charge is refunded and the order is cancelled")
	requireRefunded(t, e, "k-1")
}
