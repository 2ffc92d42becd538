package idemclient

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/dbtest"
)

// TestSeeOtherIsTheAnswer: a POST answered 303 See Other (done: read it
// there) gets the 303 itself as its answer. Following it would send a GET
// under the POST's key, which a server that checks keys answers 422 (the
// key used for another request): a caller told so would make a new key
// and do the POST again.
//
// Mutation caught: redirects followed whatever the method (422, and the
// GET sent).
func TestSeeOtherIsTheAnswer(t *testing.T) {
	t.Parallel()
	mw, err := idemhttp.Middleware(dbtest.NewPool(t, 4), idemhttp.Config{Tenant: func(*http.Request) (string, error) { return "acme", nil }})
	require.NoError(t, err)
	var posts, gets atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, _ *http.Request) {
		posts.Add(1)
		w.Header().Set("Location", "/orders/1")
		w.WriteHeader(http.StatusSeeOther)
	})
	mux.HandleFunc("GET /orders/1", func(w http.ResponseWriter, _ *http.Request) {
		gets.Add(1)
		_, _ = io.WriteString(w, "order 1")
	})
	srv := httptest.NewServer(mw(mux))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, Config{})

	resp, _ := send(t, c, srv.URL+"/orders", "", `{}`)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "/orders/1", resp.Header.Get("Location"))
	require.False(t, resp.Replayed)
	again, _ := send(t, c, srv.URL+"/orders", resp.Key, `{}`)
	require.Equal(t, http.StatusSeeOther, again.StatusCode)
	require.True(t, again.Replayed, "the POST's own answer, from its record")
	require.EqualValues(t, 1, posts.Load())
	require.Zero(t, gets.Load())
}

// TestTemporaryRedirectKeepsTheRequest: 307 and 308 say "send this same
// request there": it goes with its method, body and key, as the HTTP
// client's CheckRedirect allows.
//
// Mutation caught: every redirect refused (the 307 returned).
func TestTemporaryRedirectKeepsTheRequest(t *testing.T) {
	t.Parallel()
	var redirects atomic.Int32
	c, _ := newClient(t, Config{HTTPClient: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error {
		redirects.Add(1)
		return nil
	}}})
	srv := newServer(t, nil, func(_ int, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/old" {
			http.Redirect(w, r, "/new", http.StatusTemporaryRedirect)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	resp, _ := send(t, c, srv.url+"/old", "", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	got := srv.requests()
	require.Len(t, got, 2)
	require.Equal(t, got[0].key, got[1].key)
	require.Equal(t, resp.Key, got[1].key)
	require.Equal(t, `{"amount":1}`, got[1].body)
	require.EqualValues(t, 1, redirects.Load(), "the HTTP client's own CheckRedirect still runs")
}
