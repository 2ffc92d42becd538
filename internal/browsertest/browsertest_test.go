package browsertest_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/browsertest"
)

// pages are the test pages: a styled one, a blank one, one without
// styles, and one broken three ways.
var pages = map[string]string{
	"/styled": `<!doctype html><html><body style="margin:0;font:16px sans-serif">
<header style="background:#1f4e79;color:#fff;height:80px;padding:20px">Console</header>
<main style="padding:20px"><h1 id="title">Keys</h1><p>in flight: 3</p></main></body></html>`,
	"/blank":    `<!doctype html><html><body></body></html>`,
	"/unstyled": "<!doctype html><html><body><h1>Keys</h1>" + strings.Repeat("<p>acme order-1234 checkout in_flight charge 3 attempts</p>", 20) + "</body></html>",
	"/broken": `<!doctype html><html><head><link rel="stylesheet" href="/missing.css"></head>
<body><h1 id="title">Broken</h1><script>console.error("boom"); undefinedFunction();</script></body></html>`,
}

func serve(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		page, ok := pages[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if r.URL.Path == "/styled" && r.Header.Get("X-Test") != "sent" {
			http.Error(w, "the tab's header was not sent", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(page))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// Mutations caught: MinInk 0 lets the blank page pass; MinColour 0 lets the
// unstyled one pass; not sending Options.Header makes /styled answer 400,
// which the tab reports.
func TestCheckScreenshot(t *testing.T) {
	srv := serve(t)
	tab := browsertest.New(t, browsertest.Options{Header: map[string]string{"X-Test": "sent"}})
	shot := func(path string) []byte {
		tab.Do(t, chromedp.Navigate(srv.URL+path), chromedp.WaitVisible(chromedp.CSS("body")))
		return tab.Screenshot(t)
	}

	stats, err := browsertest.CheckScreenshot(shot("/styled"))
	require.NoError(t, err, "the styled page: %+v", stats)
	require.Equal(t, browsertest.Width, stats.Width)

	_, err = browsertest.CheckScreenshot(shot("/blank"))
	require.ErrorContains(t, err, "blank")

	_, err = browsertest.CheckScreenshot(shot("/unstyled"))
	require.ErrorContains(t, err, "unstyled")

	_, err = browsertest.CheckScreenshot(nil)
	require.ErrorContains(t, err, "decode")
	require.Empty(t, tab.Problems())
}

// Mutations caught: dropping any case of Tab.watch (exceptions, console
// errors, failed responses) loses its problem here.
func TestTabReportsABrokenPage(t *testing.T) {
	srv := serve(t)
	tab := browsertest.New(t, browsertest.Options{})
	tab.Do(t, chromedp.Navigate(srv.URL+"/broken"), chromedp.WaitVisible(chromedp.CSS("#title")))
	// Navigate returned after the load event, and the tab's listener has
	// seen every event before it.
	problems := tab.Problems()
	require.Contains(t, joined(problems), srv.URL+"/missing.css")
	require.Contains(t, joined(problems), "console.error: boom")
	require.Contains(t, joined(problems), "undefinedFunction is not defined")
	// The test caused them on purpose.
	tab.Expect("")
}

// Mutation caught: FindChromium ignoring ONCEFLOW_CHROMIUM finds the
// browser on PATH instead of failing.
func TestFindChromium(t *testing.T) {
	t.Setenv(browsertest.ChromiumEnv, "/nonexistent/chromium")
	_, err := browsertest.FindChromium()
	require.ErrorContains(t, err, "/nonexistent/chromium")

	t.Setenv(browsertest.ChromiumEnv, "")
	t.Setenv("PATH", t.TempDir())
	_, err = browsertest.FindChromium()
	require.ErrorContains(t, err, "apt-get install --no-install-recommends chromium")
}

func joined(ss []string) string { return strings.Join(ss, "\n") }
