// Package frontproxy is a reverse proxy with a fixed address in front of a
// server that tests kill and start again on other ports, as a load
// balancer is: the clients keep one URL (an idemclient.Client retries the
// one URL it was given) while the server behind it changes. It counts the
// requests the clients sent it.
package frontproxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// Config configures a Proxy.
type Config struct {
	// Abort makes a request that the server behind did not answer (it was
	// killed, or refused the connection) end with the client's connection
	// closed and no answer, as the server's own would have: the client
	// sees a connection error. false answers 502 Bad Gateway, as a load
	// balancer does.
	Abort bool

	// MaxIdleConns is how many idle connections to the server behind are
	// kept, for the clients' concurrency; 0 means 64.
	MaxIdleConns int
}

// maxIdleConnsDefault is Config.MaxIdleConns's default.
const maxIdleConnsDefault = 64

// Proxy forwards every request to the server it was last routed to. While
// it is down (Down, or before the first Route), requests wait for the next
// Route, or until their context ends.
type Proxy struct {
	// URL is the proxy's address, the clients' base URL.
	URL string

	requests atomic.Int64
	mu       sync.Mutex
	target   *url.URL      // nil while down
	up       chan struct{} // closed by the Route that ends the wait
	closed   chan struct{} // closed when the test ends: waiting requests give up
}

// targetKey carries a request's target from ServeHTTP to Rewrite.
type targetKey struct{}

// New starts a Proxy, down until the first Route; it stops when t ends.
func New(t testing.TB, cfg Config) *Proxy {
	t.Helper()
	p := &Proxy{up: make(chan struct{}), closed: make(chan struct{})}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = cfg.MaxIdleConns
	if transport.MaxIdleConnsPerHost == 0 {
		transport.MaxIdleConnsPerHost = maxIdleConnsDefault
	}
	proxy := &httputil.ReverseProxy{
		Transport: transport,
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(r.In.Context().Value(targetKey{}).(*url.URL))
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) {
			if cfg.Abort {
				panic(http.ErrAbortHandler) // the server closes the client's connection, unanswered
			}
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.requests.Add(1)
		target, ok := p.await(r.Context())
		if !ok {
			panic(http.ErrAbortHandler)
		}
		proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, target)))
	}))
	p.URL = srv.URL
	t.Cleanup(func() {
		close(p.closed) // before srv.Close, which waits for the requests
		srv.Close()
		transport.CloseIdleConnections()
	})
	return p
}

// Route sends the requests to the server at target (a base URL) from now
// on, and lets those waiting go to it.
func (p *Proxy) Route(target string) error {
	u, err := url.Parse(target)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.target == nil {
		close(p.up)
	}
	p.target = u
	return nil
}

// Down makes new requests wait for the next Route: there is no server to
// send them to. Requests already forwarded are not affected.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.target != nil {
		p.target, p.up = nil, make(chan struct{})
	}
}

// Requests is how many requests the clients sent the proxy.
func (p *Proxy) Requests() int64 { return p.requests.Load() }

// await returns the target, waiting for one while the proxy is down; ok is
// false when ctx ends or the proxy closes first.
func (p *Proxy) await(ctx context.Context) (target *url.URL, ok bool) {
	for {
		p.mu.Lock()
		target, up := p.target, p.up
		p.mu.Unlock()
		if target != nil {
			return target, true
		}
		select {
		case <-up:
		case <-ctx.Done():
			return nil, false
		case <-p.closed:
			return nil, false
		}
	}
}
