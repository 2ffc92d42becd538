package main

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/browsertest"
)

// operatorToken is the token the tests configure with
// --operator-token-file.
const operatorToken = "test-operator-token-0123456789"

// serveWithConsole starts serve with the console on, the provider down
// (a checkout fails at charge and waits at create_order) and a sweeper
// that does not retry it during the test.
func serveWithConsole(e *env, providerDown bool) *serveProcess {
	e.t.Helper()
	file := filepath.Join(e.t.TempDir(), "operator-token")
	require.NoError(e.t, os.WriteFile(file, []byte(operatorToken+"\n"), 0o600))
	args := []string{"--operator-token-file", file, "--sweep-every", "1h"}
	if providerDown {
		args = append(args, "--provider-url", "http://127.0.0.1:1") // nothing listens there
	}
	return e.serve(args...)
}

// TestConsoleIsBehindTheOperatorToken: the operator token opens the
// console, a tenant's API key does not, and nothing else does either; a
// browser is asked for the token.
//
// Mutations caught: operatorAuth letting a tenant's API key in; the
// console mounted without admin.Challenge.
func TestConsoleIsBehindTheOperatorToken(t *testing.T) {
	e := newEnv(t)
	p := serveWithConsole(e, false)
	get := func(bearer string) call {
		req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, p.URL+"/ops/", nil)
		require.NoError(t, err)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		return e.send(req)
	}
	res := get("")
	require.Equal(t, http.StatusUnauthorized, res.status)
	require.Contains(t, res.header.Get("WWW-Authenticate"), `Basic realm="checkout operators"`)
	require.Equal(t, http.StatusForbidden, get(apiKeyOf("acme")).status, "a tenant's key does not open it")
	require.Equal(t, http.StatusUnauthorized, get("not-"+operatorToken).status)
	res = get(operatorToken)
	require.Equal(t, http.StatusOK, res.status, res.body)
	require.Contains(t, res.body, `<span class="role">read-write</span>`)

	off := e.serve()
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, off.URL+"/ops/", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+operatorToken)
	require.Equal(t, http.StatusNotFound, e.send(req).status, "without --operator-token-file the console is off")
}

// TestConsoleFailsAStuckCheckout: a checkout stuck at create_order (the
// provider is down) is found in the console, and the operator fails it
// there with a confirmation; the client's retry then gets the stored
// failure and nothing is charged.
//
// Mutation caught: the console mounted at /ops/ without stripping the
// prefix (every page is 404).
func TestConsoleFailsAStuckCheckout(t *testing.T) {
	e := newEnv(t)
	p := serveWithConsole(e, true)
	res := e.checkout(p, "k-stuck", order)
	require.Equal(t, http.StatusInternalServerError, res.status, res.body)

	tab := browsertest.New(t, browsertest.Options{Header: map[string]string{"Authorization": "Bearer " + operatorToken}})
	tab.Do(t, chromedp.Navigate(p.URL+"/ops/?tenant=acme&status=in_flight"), chromedp.WaitVisible(chromedp.CSS("#records")))
	require.Equal(t, "k-stuck", tab.Text(t, "#records a.key"))
	tab.Do(t, chromedp.Click(chromedp.CSS("#records a.key")), chromedp.WaitVisible(chromedp.CSS("#fields")))
	require.Equal(t, "create_order", tab.Text(t, "#recovery-point"))
	require.Contains(t, tab.Text(t, "#request"), `"amount_cents": 4200`)
	if dir := os.Getenv("ONCEFLOW_CONSOLE_SCREENSHOTS"); dir != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "console-checkout.png"), tab.Screenshot(t), 0o644))
	}

	tab.Do(t, chromedp.Click(chromedp.CSS(`button[data-action="fail"]`)), chromedp.WaitVisible(chromedp.CSS("#confirm")),
		chromedp.SendKeys(chromedp.CSS("#confirm-reason"), "card network outage"),
		chromedp.Click(chromedp.CSS("#confirm-ok")), chromedp.WaitVisible(chromedp.CSS("#notice")))
	require.Equal(t, "Fail: done.", tab.Text(t, "#notice"))
	require.Contains(t, tab.Text(t, "h1"), "failed")
	stats, err := browsertest.CheckScreenshot(tab.Screenshot(t))
	require.NoError(t, err, "%+v", stats)

	retry := e.checkout(p, "k-stuck", order)
	require.Equal(t, http.StatusInternalServerError, retry.status)
	require.Contains(t, retry.body, "stopped and will not be retried")
	require.Equal(t, "true", retry.header.Get("Idempotent-Replayed"))
	require.Empty(t, e.charges())
}
