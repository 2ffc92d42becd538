package foreign_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
)

// CheckResponse classifies real HTTP answers by status class: 2xx is
// success; 408, 425, 429 and 5xx are transient; anything else a client
// gets back (a redirect not followed, another 4xx) is permanent.
// (Mutations caught: any status moved to the other class.)
func TestCheckResponseClassifiesEachStatusClass(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		if code/100 == 3 {
			w.Header().Set("Location", "/200")
		}
		w.WriteHeader(code)
	}))
	defer srv.Close()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	const (
		ok = iota
		transient
		permanent
	)
	for code, want := range map[int]int{
		200: ok, 201: ok, 202: ok, 204: ok, 299: ok,
		301: permanent, 302: permanent, 304: permanent, 307: permanent,
		400: permanent, 401: permanent, 403: permanent, 404: permanent, 409: permanent, 410: permanent,
		422: permanent, 451: permanent, 499: permanent,
		408: transient, 425: transient, 429: transient,
		500: transient, 502: transient, 503: transient, 504: transient, 599: transient,
	} {
		resp, err := client.Get(fmt.Sprintf("%s/%d", srv.URL, code))
		require.NoError(t, err)
		resp.Body.Close()
		err = foreign.CheckResponse(resp)
		if want == ok {
			require.NoError(t, err, "%d", code)
			continue
		}
		var h *foreign.HTTPError
		require.ErrorAs(t, err, &h, "%d", code)
		require.Equal(t, code, h.Status)
		require.Equal(t, want == permanent, phase.IsPermanent(err), "%d permanent", code)
	}
}

// Retry-After is read in seconds or as an HTTP-date, against the answer's
// Date when it has one, and bounded. (Mutations caught: each form
// misread, the bound dropped, a date in the past taken as negative.)
func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	for _, c := range []struct {
		header http.Header
		want   time.Duration
	}{
		{http.Header{}, 0},
		{http.Header{"Retry-After": {"0"}}, 0},
		{http.Header{"Retry-After": {"120"}}, 120 * time.Second},
		{http.Header{"Retry-After": {" 7 "}}, 7 * time.Second},
		{http.Header{"Retry-After": {"3600"}}, foreign.RetryAfterMax},
		{http.Header{"Retry-After": {"3601"}}, foreign.RetryAfterMax},
		{http.Header{"Retry-After": {strings.Repeat("9", 40)}}, foreign.RetryAfterMax},
		{http.Header{"Retry-After": {"-5"}}, 0},
		{http.Header{"Retry-After": {"1.5"}}, 0},
		{http.Header{"Retry-After": {"soon"}}, 0},
		{http.Header{"Retry-After": {date(90 * time.Second)}}, 90 * time.Second},
		{http.Header{"Retry-After": {date(-time.Minute)}}, 0},
		{http.Header{"Retry-After": {date(48 * time.Hour)}}, foreign.RetryAfterMax},
		// The sender's clock is a day behind ours: its Date counts.
		{http.Header{"Retry-After": {date(-24*time.Hour + 30*time.Second)}, "Date": {date(-24 * time.Hour)}}, 30 * time.Second},
		{http.Header{"Retry-After": {date(30 * time.Second)}, "Date": {"yesterday"}}, 30 * time.Second},
	} {
		require.Equal(t, c.want, foreign.RetryAfterOf(c.header, now), "%v", c.header)
	}
}

// CheckResponse puts a transient answer's Retry-After in its error, and
// the error says it.
func TestCheckResponseCarriesRetryAfter(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "42")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	resp.Body.Close()
	err = foreign.CheckResponse(resp)
	var h *foreign.HTTPError
	require.ErrorAs(t, err, &h)
	require.Equal(t, 42*time.Second, h.RetryAfter)
	require.Equal(t, "HTTP 429 Too Many Requests (retry after 42s)", err.Error())
}
