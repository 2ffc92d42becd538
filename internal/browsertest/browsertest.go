// Package browsertest drives a real headless Chromium for tests of web
// pages, through github.com/chromedp/chromedp.
//
// New starts a browser of the test's own (a fresh profile, closed when the
// test ends) and opens one tab. The tab records what makes a page broken
// without failing an assertion by itself: an exception no script caught, an
// error on the console, a request that failed, a response of status 400 or
// more. When the test ends, any such problem fails it, unless the test said
// it expected it (Tab.Expect). Tests never skip for want of a browser: a
// machine without Chromium fails them with a message saying how to install
// it (the Debian package chromium, which .ci/run installs), or to name one
// in ONCEFLOW_CHROMIUM.
//
// CheckScreenshot decides whether a screenshot shows a page at all: an
// empty, blank or unstyled page fails it.
package browsertest

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// ChromiumEnv names the environment variable that points the tests at a
// Chrome or Chromium binary other than the one on PATH.
const ChromiumEnv = "ONCEFLOW_CHROMIUM"

// TimeoutDefault bounds a tab's life: every action of a test runs within
// it.
const TimeoutDefault = 2 * time.Minute

// StepTimeoutDefault bounds each step of Tab's helpers (Do, Text, Count,
// Screenshot): a page that never shows what a test waits for fails the test
// in this time, not at the end of the tab's life.
const StepTimeoutDefault = 30 * time.Second

// MaxBrowsers is how many browsers the tests of one package run at once;
// a test that would start one more waits for a running one to close.
// Chromium is heavy for the small machines CI runs on.
const MaxBrowsers = 2

// browsers holds a slot for each running browser.
var browsers = make(chan struct{}, MaxBrowsers)

// Width and Height are the size of the browser's window, and so of a
// screenshot of the viewport.
const (
	Width  = 1280
	Height = 900
)

// Options configures New.
type Options struct {
	// Header is sent with every request of the tab, the page's scripts'
	// included (e.g. Authorization). Default: none.
	Header map[string]string
	// Timeout bounds the tab's life. 0 means TimeoutDefault.
	Timeout time.Duration
	// StepTimeout bounds each call of the Tab's helpers. 0 means
	// StepTimeoutDefault.
	StepTimeout time.Duration
}

// Tab is one tab of a headless Chromium, with what went wrong in it.
type Tab struct {
	// Ctx runs chromedp actions in the tab: chromedp.Do(tab.Ctx, ...).
	Ctx context.Context

	step     time.Duration
	mu       sync.Mutex
	problems []string
	expected []string
}

// FindChromium returns the browser binary tests use: ONCEFLOW_CHROMIUM, or
// the first of chromium, chromium-browser, google-chrome on PATH.
func FindChromium() (string, error) {
	if path := os.Getenv(ChromiumEnv); path != "" {
		if _, err := exec.LookPath(path); err != nil {
			return "", fmt.Errorf("%s=%s: %w", ChromiumEnv, path, err)
		}
		return path, nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if path, err := exec.LookPath(name); err == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("no Chromium found on PATH: the browser tests need headless Chromium; " +
		"install it with `apt-get install --no-install-recommends chromium` (as .ci/run does) " +
		"or set " + ChromiumEnv + " to a Chrome or Chromium binary")
}

// New starts a headless Chromium for t and opens a tab in it. The browser
// stops when t ends; the problems the tab saw then fail t.
func New(t testing.TB, opts Options) *Tab {
	t.Helper()
	path, err := FindChromium()
	if err != nil {
		t.Fatal(err)
	}
	browsers <- struct{}{}
	t.Cleanup(func() { <-browsers }) // runs after the cleanup below, which closes the browser
	ctx, cancelTimeout := context.WithTimeout(context.Background(), cmp.Or(opts.Timeout, TimeoutDefault))
	allocOpts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.WindowSize(Width, Height),
		// Tests run as root in CI, where Chromium's sandbox refuses to
		// start; the pages they load are the test's own.
		chromedp.NoSandbox,
		chromedp.DisableGPU,
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, allocOpts...)
	tab := &Tab{step: cmp.Or(opts.StepTimeout, StepTimeoutDefault)}
	tabCtx, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithListener(tab.watch))
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
		cancelTimeout()
		tab.check(t)
	})
	tab.Ctx = tabCtx
	if err := chromedp.Do(tabCtx); err != nil { // starts the browser
		t.Fatalf("start Chromium %s: %v", path, err)
	}
	if len(opts.Header) > 0 {
		headers := network.Headers{}
		for name, value := range opts.Header {
			headers[name] = value
		}
		if _, err := chromedp.Call(tabCtx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: headers}); err != nil {
			t.Fatalf("set the tab's headers: %v", err)
		}
	}
	return tab
}

// watch records the events that say a page is broken. It runs in the
// tab's event loop: it must return fast and run no command.
func (tab *Tab) watch(ev any) {
	var problem string
	switch ev := ev.(type) {
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		problem = "uncaught exception: " + d.Text
		if d.Exception != nil {
			problem += " " + d.Exception.Description
		}
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
			var args []string
			for _, arg := range ev.Args {
				args = append(args, describe(arg))
			}
			problem = "console." + string(ev.Type) + ": " + strings.Join(args, " ")
		}
	case *log.EventEntryAdded:
		if ev.Entry.Level == log.EntryLevelError && !strings.HasSuffix(ev.Entry.URL, "/favicon.ico") {
			problem = "browser log: " + ev.Entry.Text + " " + ev.Entry.URL
		}
	case *network.EventResponseReceived:
		// A browser asks for /favicon.ico on its own.
		if ev.Response.Status >= 400 && !strings.HasSuffix(ev.Response.URL, "/favicon.ico") {
			problem = fmt.Sprintf("HTTP %d from %s", ev.Response.Status, ev.Response.URL)
		}
	case *network.EventLoadingFailed:
		if !ev.Canceled {
			problem = fmt.Sprintf("request %s failed: %s", ev.RequestID, ev.ErrorText)
		}
	}
	if problem != "" {
		tab.mu.Lock()
		defer tab.mu.Unlock()
		tab.problems = append(tab.problems, problem)
	}
}

func describe(arg *runtime.RemoteObject) string {
	if arg.Description != "" {
		return arg.Description
	}
	return strings.Trim(string(arg.Value), `"`)
}

// Expect marks problems that contain substr as expected: the test causes
// them on purpose (a refused action answers 409, say), and they do not fail
// it.
func (tab *Tab) Expect(substr string) {
	tab.mu.Lock()
	defer tab.mu.Unlock()
	tab.expected = append(tab.expected, substr)
}

// Problems returns what went wrong in the tab so far that was not expected.
func (tab *Tab) Problems() []string {
	tab.mu.Lock()
	defer tab.mu.Unlock()
	var out []string
	for _, p := range tab.problems {
		if !slices.ContainsFunc(tab.expected, func(e string) bool { return strings.Contains(p, e) }) {
			out = append(out, p)
		}
	}
	return out
}

// check fails t with the problems the tab saw.
func (tab *Tab) check(t testing.TB) {
	for _, p := range tab.Problems() {
		t.Errorf("the page was broken: %s", p)
	}
}

// Do runs actions in the tab and fails t at the first error.
func (tab *Tab) Do(t testing.TB, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab.Ctx, tab.step)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("browser: %v (problems so far: %q)", err, tab.Problems())
	}
}

// Text returns the visible text of the first element sel matches.
func (tab *Tab) Text(t testing.TB, sel string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab.Ctx, tab.step)
	defer cancel()
	text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("browser: text of %s: %v", sel, err)
	}
	return text
}

// Count returns how many elements sel matches now, without waiting.
func (tab *Tab) Count(t testing.TB, sel string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab.Ctx, tab.step)
	defer cancel()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
	if err != nil {
		t.Fatalf("browser: count %s: %v", sel, err)
	}
	return n
}

// Screenshot returns a PNG of the tab's viewport.
func (tab *Tab) Screenshot(t testing.TB) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab.Ctx, tab.step)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("browser: screenshot: %v", err)
	}
	return png
}
