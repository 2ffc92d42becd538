package admin_test

import (
	"context"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/admin"
	"github.com/onceflow/onceflow/internal/browsertest"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/recovery"
)

// The console's tests click through its pages in a real headless
// Chromium (internal/browsertest), against a real server and database, the
// console mounted under /ops/ as an application mounts it.

// ScreenshotsEnv names a directory the screenshot test writes its PNGs
// to, for the docs (docs/console.png).
const screenshotsEnv = "ONCEFLOW_CONSOLE_SCREENSHOTS"

// consoleRoles is the console tests' authenticator: a bearer token per
// role.
func consoleRoles(r *http.Request) (admin.Role, error) {
	switch r.Header.Get("Authorization") {
	case "Bearer console-reader":
		return admin.RoleRead, nil
	case "Bearer console-writer":
		return admin.RoleWrite, nil
	}
	return admin.RoleNone, errors.New("no such token")
}

// consoleServer serves b's console under /ops/ and returns its URL.
func consoleServer(t *testing.T, b *bundle) string {
	t.Helper()
	a, err := admin.New(b.db, admin.Config{Authorize: consoleRoles})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", a.Handler()))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/ops/"
}

// browser opens a tab that sends token with every request.
func browser(t *testing.T, token string) *browsertest.Tab {
	return browsertest.New(t, browsertest.Options{Header: map[string]string{"Authorization": "Bearer " + token}})
}

func css(sel string) chromedp.CSS { return chromedp.CSS(sel) }

// Mutations caught: the release button's data-owner left out (the API
// refuses the action: 400, the dialog shows it and the record stays); the
// JavaScript not reloading after a success (no notice); the key's link
// built without escaping (the detail of "order/42?x=1" is not found);
// <base href> left out (the links resolve outside /ops/: 404); the
// timeline built from the record's fields although it has a history.
func TestConsoleListDetailRelease(t *testing.T) {
	b := setup(t, admin.Config{})
	odd := key("acme corp", "order/42?x=1")
	stuck := b.stuck(t, odd, "checkout")
	b.completed(t, key("acme", "order-3"), "checkout")
	base := consoleServer(t, b)
	tab := browser(t, "console-writer")

	// The stuck keys: the completed one is not listed.
	tab.Do(t, chromedp.Navigate(base+"?status=in_flight&stuck_for=1ms"), chromedp.WaitVisible(css("#records")))
	require.Equal(t, 1, tab.Count(t, "#records tbody tr"))
	require.Equal(t, "order/42?x=1", tab.Text(t, "#records a.key"))

	// Its detail.
	tab.Do(t, chromedp.Click(css("#records a.key")), chromedp.WaitVisible(css("#fields")))
	require.Equal(t, "order/42?x=1", tab.Text(t, "#key"))
	require.Equal(t, stuck.Owner.String(), tab.Text(t, "#owner"))
	require.Equal(t, "0", tab.Text(t, "#attempts"))
	require.Contains(t, tab.Text(t, "#request"), `"order": "order/42?x=1"`)
	require.Contains(t, tab.Text(t, "#timeline"), "claimed")
	require.Contains(t, tab.Text(t, "#timeline"), "lease_expired")

	// Release it, with a confirmation.
	tab.Do(t, chromedp.Click(css(`button[data-action="release"]`)), chromedp.WaitVisible(css("#confirm")))
	require.Contains(t, tab.Text(t, "#confirm-text"), "Release key order/42?x=1 of tenant acme corp")
	tab.Do(t, chromedp.SendKeys(css("#confirm-reason"), "provider outage, INC-7"),
		chromedp.Click(css("#confirm-ok")), chromedp.WaitVisible(css("#notice")))
	require.Equal(t, "Release: done.", tab.Text(t, "#notice"))
	require.Equal(t, "1", tab.Text(t, "#attempts"))
	require.Contains(t, tab.Text(t, "#last-error"), "provider outage, INC-7")
	require.Contains(t, tab.Text(t, "#timeline li:last-child"), "released_by_operator")
	require.Contains(t, tab.Text(t, "#timeline li:last-child"), "provider outage, INC-7")

	rec := b.load(t, odd)
	require.Equal(t, recovery.StatusInFlight, rec.Status)
	require.True(t, rec.Released)
	require.Equal(t, 1, rec.Attempts)
	require.Contains(t, rec.LastError, "released by an operator: provider outage, INC-7")
	require.NotEqual(t, stuck.Owner, rec.Owner, "the release fenced out the old owner")
	require.Equal(t, rec.Owner.String(), tab.Text(t, "#owner"), "the page shows the record as it is now")
}

// Mutations caught: the force checkbox's value not sent (the forced
// release is refused again); the dialog not showing the problem's detail.
func TestConsoleRefusesALiveLeaseUntilForced(t *testing.T) {
	b := setup(t, admin.Config{})
	k := key("acme", "order-live")
	live := b.claim(t, k, "checkout")
	base := consoleServer(t, b)
	tab := browser(t, "console-writer")
	tab.Expect("HTTP 409") // refused on purpose, below
	tab.Expect("status of 409")

	tab.Do(t, chromedp.Navigate(base+"keys/acme/order-live"), chromedp.WaitVisible(css("#fields")))
	require.Contains(t, tab.Text(t, "#lease"), "held until")
	tab.Do(t, chromedp.Click(css(`button[data-action="fail"]`)), chromedp.WaitVisible(css("#confirm")),
		chromedp.Click(css("#confirm-ok")), chromedp.WaitVisible(css("#confirm-error")))
	require.Contains(t, tab.Text(t, "#confirm-error"), "lease is still valid")
	require.Equal(t, live.Owner, b.load(t, k).Owner, "nothing was written")

	tab.Do(t, chromedp.Click(css("#confirm-force")), chromedp.Click(css("#confirm-ok")), chromedp.WaitVisible(css("#notice")))
	require.Equal(t, "Fail: done.", tab.Text(t, "#notice"))
	require.Equal(t, recovery.StatusFailed, b.load(t, k).Status)
	require.Equal(t, 0, tab.Count(t, "#actions"), "a finished record offers no actions")
}

// Mutation caught: the retry button's URL built from another field than
// the message's id (404, the message stays dead).
func TestConsoleRetriesADeadLetter(t *testing.T) {
	b := setup(t, admin.Config{})
	ids := deadLetters(t, b)
	base := consoleServer(t, b)
	tab := browser(t, "console-writer")

	tab.Do(t, chromedp.Navigate(base), chromedp.Click(css(`a[href="outbox"]`)), chromedp.WaitVisible(css("#messages")))
	require.Contains(t, tab.Text(t, "#messages"), "smtp down")
	second := fmt.Sprintf(`#message-%d button[data-action="retry"]`, ids[1])
	tab.Do(t, chromedp.Click(css(second)), chromedp.WaitVisible(css("#confirm")),
		chromedp.Click(css("#confirm-ok")), chromedp.WaitVisible(css("#notice")))
	require.Equal(t, "Retry: done.", tab.Text(t, "#notice"))
	require.Equal(t, 1, tab.Count(t, "#messages tbody tr"), "the retried message is no longer dead")

	msgs, err := outboxOf(t).List(b.ctx, b.db, outbox.Filter{Status: outbox.StatusPending})
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, ids[1], msgs[0].ID)
}

// Mutation caught: the layout offering the actions whatever the role (the
// read-only operator sees buttons).
func TestConsoleReadOnly(t *testing.T) {
	b := setup(t, admin.Config{})
	b.stuck(t, key("acme", "order-1"), "checkout")
	deadLetters(t, b)
	base := consoleServer(t, b)
	tab := browser(t, "console-reader")

	tab.Do(t, chromedp.Navigate(base+"keys/acme/order-1"), chromedp.WaitVisible(css("#fields")))
	require.Equal(t, 0, tab.Count(t, "button[data-action]"))
	require.Equal(t, 0, tab.Count(t, "#confirm"))
	require.Equal(t, "read-only", tab.Text(t, ".role"))
	tab.Do(t, chromedp.Navigate(base+"outbox"), chromedp.WaitVisible(css("#messages")))
	require.Equal(t, 0, tab.Count(t, "button[data-action]"))
}

// Mutations caught: the bulk filter built from the whole query (cursor
// and all: the API refuses it), or left empty (every key is released);
// the report's skipped records not counted in the notice; bulk actions
// offered for a listing without a filter.
func TestConsoleBulkRelease(t *testing.T) {
	b := setup(t, admin.Config{})
	b.stuck(t, key("acme", "order-1"), "checkout")
	b.stuck(t, key("acme", "order-2"), "checkout")
	live := b.claim(t, key("acme", "order-live"), "checkout")
	other := b.stuck(t, key("globex", "order-3"), "checkout")
	base := consoleServer(t, b)
	tab := browser(t, "console-writer")

	tab.Do(t, chromedp.Navigate(base), chromedp.WaitVisible(css("#records")))
	require.Equal(t, 0, tab.Count(t, "#bulk"), "no bulk action over every key")

	tab.Do(t, chromedp.Navigate(base+"?tenant=acme&status=in_flight&limit=1"), chromedp.WaitVisible(css("#bulk")),
		chromedp.Click(css(`button[data-action="bulk-release"]`)), chromedp.WaitVisible(css("#confirm")),
		chromedp.SendKeys(css("#confirm-reason"), "after the outage"),
		chromedp.Click(css("#confirm-ok")), chromedp.WaitVisible(css("#notice")))
	require.Equal(t, "Release all: 2 of 3 done, 1 skipped.", tab.Text(t, "#notice"))

	for _, id := range []string{"order-1", "order-2"} {
		rec := b.load(t, key("acme", id))
		require.True(t, rec.Released, id)
		require.Contains(t, rec.LastError, "after the outage", id)
	}
	require.Equal(t, live.Owner, b.load(t, live.Key).Owner, "the live lease was skipped")
	require.Equal(t, other.Owner, b.load(t, other.Key).Owner, "another tenant's key is not in the filter")
}

// TestConsoleScreenshots loads each page with records of every kind and
// requires it to render: its key elements visible, no script or request
// failing, and a screenshot that is neither blank nor unstyled. With
// ONCEFLOW_CONSOLE_SCREENSHOTS set to a directory, it writes the PNGs
// there (docs/console.png comes from here).
//
// Mutations caught: the stylesheet's link broken (404, and an unstyled
// screenshot); a template that fails half-way (the page is the error
// text); a script error in console.js.
func TestConsoleScreenshots(t *testing.T) {
	b := setup(t, admin.Config{})
	b.stuck(t, key("acme", "order-1042"), "checkout")
	b.completed(t, key("acme", "order-1041"), "checkout")
	b.parked(t, key("globex", "order-77"), "checkout")
	b.compensating(t, key("globex", "order-78"), "refund")
	b.claim(t, key("initech", "order-9"), "checkout")
	deadLetters(t, b)
	base := consoleServer(t, b)
	tab := browser(t, "console-writer")

	pages := []struct{ name, path, visible string }{
		{"console.png", "", "#records"},
		{"console-stuck.png", "?status=in_flight&stuck_for=1ms", "#records"},
		{"console-key.png", "keys/acme/order-1042", "#timeline"},
		{"console-outbox.png", "outbox", "#messages"},
	}
	for _, p := range pages {
		tab.Do(t, chromedp.Navigate(base+p.path), chromedp.WaitVisible(css(p.visible)), chromedp.WaitVisible(css("header.top nav")))
		png := tab.Screenshot(t)
		stats, err := browsertest.CheckScreenshot(png)
		require.NoError(t, err, "%s: %+v", p.path, stats)
		if dir := os.Getenv(screenshotsEnv); dir != "" {
			require.NoError(t, os.WriteFile(filepath.Join(dir, p.name), png, 0o644))
		}
	}
	tab.Do(t, chromedp.Navigate(base), chromedp.WaitVisible(css("#records")))
	require.Equal(t, 5, tab.Count(t, "#records tbody tr"))
}

// deadLetters makes two outbox messages that failed for good and returns
// their ids.
func deadLetters(t *testing.T, b *bundle) []int64 {
	t.Helper()
	ob := outboxOf(t)
	for _, order := range []int{1041, 1042} {
		require.NoError(t, ob.Enqueue(b.ctx, b.db, outbox.Message{Topic: "receipt",
			DedupeKey: fmt.Sprintf("order-%d/receipt", order), Payload: map[string]any{"order": order}}))
	}
	relay, err := outbox.NewRelay(b.db, outbox.RelayConfig{MaxAttempts: 1, Handlers: map[string]outbox.Handler{
		"receipt": func(context.Context, *outbox.Record) error { return errors.New("smtp down") }}})
	require.NoError(t, err)
	_, err = relay.RunOnce(b.ctx)
	require.NoError(t, err)
	msgs, err := ob.List(b.ctx, b.db, outbox.Filter{Status: outbox.StatusDead})
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	return []int64{msgs[0].ID, msgs[1].ID}
}

func outboxOf(t *testing.T) *outbox.Outbox {
	ob, err := outbox.New(outbox.Config{})
	require.NoError(t, err)
	return ob
}

// The pages without a browser: what they answer and the headers that
// keep them from being framed.
//
// Mutations caught: the Content-Security-Policy or X-Frame-Options header
// dropped; the listing not defaulting to recent work first; the timeline
// of a record without history left empty; a stuck_for below 1µs let
// through (it lists finished records too); an unknown key rendered as 200; the console's filter passing
// the form's empty fields on (a filter with an empty created_from is 400).
func TestConsolePages(t *testing.T) {
	b := setup(t, admin.Config{})
	b.stuck(t, key("acme", "order-1"), "checkout")
	b.completed(t, key("acme", "order-2"), "checkout")
	base := consoleServer(t, b)
	get := func(path, token string) (page, string) {
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return page{StatusCode: resp.StatusCode, Header: resp.Header}, string(body)
	}

	resp, body := get("?tenant=&workflow=&status=&stuck_for=&created_from=&created_to=", "console-reader")
	require.Equal(t, 200, resp.StatusCode, body)
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'")
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'self'")
	require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))
	require.Contains(t, body, `<base href="/ops/">`)
	require.Less(t, strings.Index(body, "order-2"), strings.Index(body, "order-1"), "recent work first")
	_, body = get("?stuck_for=1ms", "console-reader")
	require.NotContains(t, body, "order-2")
	require.Contains(t, body, "order-1")
	_, body = get("?newest=false", "console-reader")
	require.Less(t, strings.Index(body, "order-1"), strings.Index(body, "order-2"), "the order asked for")
	require.Contains(t, body, `<option value="false" selected>`, "the form shows the order the list is in")

	resp, body = get("?created_from=2026-12-01T10:00", "console-reader")
	require.Equal(t, 200, resp.StatusCode, "a datetime-local value is a filter: %s", body)

	// A record written before migration 0014 has no history: its timeline
	// is what its fields say.
	_, err := b.db.Exec(b.ctx, `UPDATE onceflow_keys SET history = NULL WHERE key = 'order-2'`)
	require.NoError(t, err)
	resp, body = get("keys/acme/order-2", "console-reader")
	require.Equal(t, 200, resp.StatusCode, body)
	require.Contains(t, body, "it has no history")
	require.Contains(t, body, `event-created`)
	require.Contains(t, body, `event-completed`)

	resp, body = get("keys/acme/nope", "console-reader")
	require.Equal(t, 404, resp.StatusCode)
	require.Contains(t, body, `id="error"`)
	resp, _ = get("?stuck_for=ten", "console-reader")
	require.Equal(t, 400, resp.StatusCode)
	resp, body = get("?stuck_for=1ns", "console-reader")
	require.Equal(t, 400, resp.StatusCode, "below the database's microseconds it would match everything")
	require.Contains(t, body, "at least 1µs")
	resp, _ = get("", "")
	require.Equal(t, 401, resp.StatusCode, "the console is behind Authorize")
	resp, _ = get("static/console.js", "")
	require.Equal(t, 401, resp.StatusCode, "its assets too")
	resp, body = get("static/console.js", "console-reader")
	require.Equal(t, 200, resp.StatusCode)
	require.Contains(t, body, "use strict")
}

// page is what a GET of a console page answered, but its body.
type page struct {
	StatusCode int
	Header     http.Header
}

// TestConsoleLinksReachDotKeys: a tenant or key "." or ".." (a client may
// choose such an idempotency key) is reached by the listing's link and
// acted on by its page's buttons, once a browser has resolved their
// relative URLs (RFC 3986, as url.ResolveReference does): left as dot
// segments they would lead to keys/ or to no record at all.
//
// Mutation caught: keyPath escaping with url.PathEscape alone (the link
// resolves to /ops/keys/, a 404, and the release to /ops/api/keys/release).
func TestConsoleLinksReachDotKeys(t *testing.T) {
	b := setup(t, admin.Config{})
	base, err := url.Parse(consoleServer(t, b))
	require.NoError(t, err)
	send := func(method string, u *url.URL, body string) (int, string) {
		req, err := http.NewRequest(method, u.String(), strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer console-writer")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(out)
	}
	attr := regexp.MustCompile(`(href|data-url)="([^"]*)"`)
	resolve := func(page, prefix string) *url.URL {
		for _, m := range attr.FindAllStringSubmatch(page, -1) {
			if ref := html.UnescapeString(m[2]); strings.HasPrefix(ref, prefix) {
				u, err := url.Parse(ref)
				require.NoError(t, err)
				return base.ResolveReference(u)
			}
		}
		t.Fatalf("no link starting %q in the page", prefix)
		return nil
	}

	for _, k := range []recovery.Key{key("dots", ".."), key("..", "order-1"), key(".", ".")} {
		rec := b.stuck(t, k, "checkout")
		status, listing := send("GET", base.ResolveReference(&url.URL{RawQuery: "tenant=" + url.QueryEscape(k.Tenant)}), "")
		require.Equal(t, 200, status, listing)
		status, detail := send("GET", resolve(listing, "keys/"), "")
		require.Equal(t, 200, status, "%v: the listing's link leads to the record's page: %s", k, detail)
		require.Contains(t, detail, `data-owner="`+rec.Owner.String()+`"`, "%v", k)
		status, body := send("POST", resolve(detail, "api/keys/"), ownerBody(rec, false))
		require.Equal(t, 200, status, "%v: the page's first action acts on the record: %s", k, body)
		require.NotEqual(t, rec.Owner, b.load(t, k).Owner, "%v: released", k)
	}
}
