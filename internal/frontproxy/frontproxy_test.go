package frontproxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// named is a server that answers with its name.
func named(t *testing.T, name string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, name+" "+r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func get(ctx context.Context, url string) (string, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), resp.StatusCode, err
}

// TestRouteDownRoute: the proxy forwards to the server it was routed to;
// while down, a request waits until the next Route and goes there.
func TestRouteDownRoute(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := New(t, Config{})
	require.NoError(t, p.Route(named(t, "one").URL))
	body, _, err := get(ctx, p.URL+"/a")
	require.NoError(t, err)
	require.Equal(t, "one /a", body)

	p.Down()
	got := make(chan string, 1)
	go func() {
		body, _, err := get(ctx, p.URL+"/b")
		if err != nil {
			body = err.Error()
		}
		got <- body
	}()
	// The request is counted on arrival, then waits.
	require.Eventually(t, func() bool { return p.Requests() == 2 }, time.Minute, time.Millisecond)
	select {
	case body := <-got:
		t.Fatalf("answered while down: %s", body)
	default:
	}
	require.NoError(t, p.Route(named(t, "two").URL))
	require.Equal(t, "two /b", <-got)
}

// TestUnreachable: a server gone behind the proxy is a 502, or with
// Abort, a connection closed with no answer.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()

	p := New(t, Config{})
	require.NoError(t, p.Route(gone.URL))
	_, status, err := get(ctx, p.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadGateway, status)

	aborting := New(t, Config{Abort: true})
	require.NoError(t, aborting.Route(gone.URL))
	_, _, err = get(ctx, aborting.URL)
	require.ErrorIs(t, err, io.EOF)
}
