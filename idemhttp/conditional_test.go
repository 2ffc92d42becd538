package idemhttp_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
)

func TestETagRoundTrips(t *testing.T) {
	t.Parallel()
	for _, version := range []int64{0, 1, 7, -3, 1 << 62} {
		v, ok := idemhttp.VersionFromETag(idemhttp.ETag(version))
		require.True(t, ok, version)
		require.Equal(t, version, v)
	}
	require.Equal(t, `"v7"`, idemhttp.ETag(7))
	for _, tag := range []string{`W/"v7"`, `v7`, `"v07"`, `"v+7"`, `"7"`, `"v7`, `"v"`, `""`, ``, `"v99999999999999999999"`} {
		_, ok := idemhttp.VersionFromETag(tag)
		require.False(t, ok, tag)
	}
}

func TestCheckPreconditions(t *testing.T) {
	t.Parallel()
	const current = `"v7"`
	for _, tc := range []struct {
		name        string
		method      string
		ifMatch     []string
		ifNoneMatch []string
		current     string
		required    bool
		want        error
	}{
		{name: "no headers", method: http.MethodPatch, current: current},
		{name: "no headers, required", method: http.MethodPatch, current: current, required: true, want: idemhttp.ErrPreconditionRequired},
		{name: "no headers, required, missing resource", method: http.MethodPut, required: true, want: idemhttp.ErrPreconditionRequired},

		{name: "If-Match current", method: http.MethodPatch, ifMatch: []string{current}, current: current, required: true},
		{name: "If-Match stale", method: http.MethodPatch, ifMatch: []string{`"v6"`}, current: current, required: true, want: idemhttp.ErrPreconditionFailed},
		{name: "If-Match weak is never a strong match", method: http.MethodPatch, ifMatch: []string{`W/"v7"`}, current: current, want: idemhttp.ErrPreconditionFailed},
		{name: "If-Match against a weak current", method: http.MethodPatch, ifMatch: []string{current}, current: `W/"v7"`, want: idemhttp.ErrPreconditionFailed},
		{name: "If-Match list", method: http.MethodPatch, ifMatch: []string{`"v5", "v7"`}, current: current},
		{name: "If-Match list over repeated headers", method: http.MethodPatch, ifMatch: []string{`"v5"`, `"v7"`}, current: current},
		{name: "If-Match list with empty members", method: http.MethodPatch, ifMatch: []string{` ,"v5",, "v7" ,`}, current: current},
		{name: "If-Match list without current", method: http.MethodPatch, ifMatch: []string{`"v5", "v6"`}, current: current, want: idemhttp.ErrPreconditionFailed},
		{name: "If-Match tag holding a comma", method: http.MethodPatch, ifMatch: []string{`"a,b"`}, current: `"a,b"`},
		{name: "If-Match star", method: http.MethodPatch, ifMatch: []string{"*"}, current: current},
		{name: "If-Match star, missing resource", method: http.MethodPatch, ifMatch: []string{"*"}, want: idemhttp.ErrPreconditionFailed},
		{name: "If-Match tag, missing resource", method: http.MethodPatch, ifMatch: []string{current}, want: idemhttp.ErrPreconditionFailed},
		{name: "If-Match false on GET", method: http.MethodGet, ifMatch: []string{`"v6"`}, current: current, want: idemhttp.ErrPreconditionFailed},

		{name: "If-None-Match star, missing resource", method: http.MethodPut, ifNoneMatch: []string{"*"}, required: true},
		{name: "If-None-Match star, existing", method: http.MethodPut, ifNoneMatch: []string{"*"}, current: current, want: idemhttp.ErrPreconditionFailed},
		{name: "If-None-Match other tag", method: http.MethodPatch, ifNoneMatch: []string{`"v6"`}, current: current},
		{name: "If-None-Match current on PATCH", method: http.MethodPatch, ifNoneMatch: []string{current}, current: current, want: idemhttp.ErrPreconditionFailed},
		{name: "If-None-Match weak matches weakly", method: http.MethodPatch, ifNoneMatch: []string{`W/"v7"`}, current: current, want: idemhttp.ErrPreconditionFailed},
		{name: "If-None-Match current on GET", method: http.MethodGet, ifNoneMatch: []string{`"v1", W/"v7"`}, current: current, want: idemhttp.ErrNotModified},
		{name: "If-None-Match current on HEAD", method: http.MethodHead, ifNoneMatch: []string{current}, current: current, want: idemhttp.ErrNotModified},
		{name: "If-None-Match star on GET", method: http.MethodGet, ifNoneMatch: []string{"*"}, current: current, want: idemhttp.ErrNotModified},
		{name: "If-None-Match, missing resource", method: http.MethodGet, ifNoneMatch: []string{current}},

		{name: "both true", method: http.MethodPatch, ifMatch: []string{current}, ifNoneMatch: []string{`"v6"`}, current: current},
		{name: "If-Match true, If-None-Match false", method: http.MethodPatch, ifMatch: []string{current}, ifNoneMatch: []string{current}, current: current, want: idemhttp.ErrPreconditionFailed},
		{name: "If-Match false first", method: http.MethodGet, ifMatch: []string{`"v6"`}, ifNoneMatch: []string{current}, current: current, want: idemhttp.ErrPreconditionFailed},

		{name: "unquoted tag", method: http.MethodPatch, ifMatch: []string{"v7"}, current: current, want: idemhttp.ErrBadPrecondition},
		{name: "unterminated tag", method: http.MethodPatch, ifMatch: []string{`"v7`}, current: current, want: idemhttp.ErrBadPrecondition},
		{name: "tags without a comma", method: http.MethodPatch, ifMatch: []string{`"v6" "v7"`}, current: current, want: idemhttp.ErrBadPrecondition},
		{name: "star in a list", method: http.MethodPatch, ifMatch: []string{`*, "v7"`}, current: current, want: idemhttp.ErrBadPrecondition},
		{name: "star in a repeated header", method: http.MethodPatch, ifMatch: []string{`"v7"`, "*"}, current: current, want: idemhttp.ErrBadPrecondition},
		{name: "empty If-Match", method: http.MethodPatch, ifMatch: []string{""}, current: current, required: true, want: idemhttp.ErrBadPrecondition},
		{name: "control byte", method: http.MethodPatch, ifNoneMatch: []string{"\"v\x017\""}, current: current, want: idemhttp.ErrBadPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, "/v1/things/1", nil)
			r.Header["If-Match"] = tc.ifMatch
			r.Header["If-None-Match"] = tc.ifNoneMatch
			err := idemhttp.CheckPreconditions(r, tc.current, tc.required)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
		})
	}
}

// TestWritePrecondition answers each precondition error over a real
// server: problem details for 400, 412 and 428, an empty 304 with the
// handler's ETag, and nothing for any other error.
func TestWritePrecondition(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", idemhttp.ETag(7))
		err := idemhttp.CheckPreconditions(r, idemhttp.ETag(7), r.Method != http.MethodGet)
		if r.URL.Query().Has("update") && err == nil {
			err = fmt.Errorf("update things: %w", idemhttp.ErrVersionMismatch)
		}
		if r.URL.Query().Has("other") {
			err = io.ErrUnexpectedEOF
		}
		if !idemhttp.WritePrecondition(w, err) {
			w.WriteHeader(http.StatusOK)
		}
	}))
	t.Cleanup(srv.Close)
	send := func(method, query string, header http.Header) (int, http.Header, string) {
		req, err := http.NewRequest(method, srv.URL+"/?"+query, nil)
		require.NoError(t, err)
		req.Header = header
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header, string(body)
	}
	for _, tc := range []struct {
		method, query string
		header        http.Header
		status        int
	}{
		{http.MethodPatch, "", http.Header{}, http.StatusPreconditionRequired},
		{http.MethodPatch, "", http.Header{"If-Match": {`"v6"`}}, http.StatusPreconditionFailed},
		{http.MethodPatch, "update", http.Header{"If-Match": {`"v7"`}}, http.StatusPreconditionFailed},
		{http.MethodPatch, "", http.Header{"If-Match": {`v7`}}, http.StatusBadRequest},
	} {
		status, header, body := send(tc.method, tc.query, tc.header)
		require.Equal(t, tc.status, status, body)
		require.Equal(t, "application/problem+json", header.Get("Content-Type"))
		var problem struct {
			Status int    `json:"status"`
			Detail string `json:"detail"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &problem))
		require.Equal(t, tc.status, problem.Status)
		require.NotEmpty(t, problem.Detail)
		require.NotContains(t, problem.Detail, "things", "the detail does not tell the client about tables")
	}

	status, header, body := send(http.MethodGet, "", http.Header{"If-None-Match": {`"v7"`}})
	require.Equal(t, http.StatusNotModified, status)
	require.Empty(t, body)
	require.Equal(t, `"v7"`, header.Get("ETag"))

	status, _, _ = send(http.MethodPatch, "", http.Header{"If-Match": {`"v7"`}})
	require.Equal(t, http.StatusOK, status)
	status, _, _ = send(http.MethodPatch, "other", http.Header{"If-Match": {`"v7"`}})
	require.Equal(t, http.StatusOK, status, "an error of another kind is the handler's to answer")
}
