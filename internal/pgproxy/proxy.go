package pgproxy

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Proxy forwards connections from a loopback port to one server, and
// faults the statements its armed rules match.
type Proxy struct {
	network, address string // the server's
	delay            time.Duration
	ln               net.Listener
	ctx              context.Context // ends at Close, and with it every dial
	cancel           context.CancelFunc
	wg               sync.WaitGroup // every goroutine the proxy started

	mu     sync.Mutex
	rules  []*Armed
	links  map[*link]struct{}
	closed bool
}

// Options configures a proxy. The zero value forwards every message at
// once.
type Options struct {
	// Delay is added to every message in each direction, as a network
	// between client and server adds it: a round trip takes twice Delay
	// longer, and messages sent together still arrive together. 0 adds
	// none.
	Delay time.Duration
}

// Listen starts a proxy on a free loopback port to the server at address
// on network ("tcp" host:port, or "unix" and a socket's path).
func Listen(network, address string) (*Proxy, error) {
	return ListenWith(network, address, Options{})
}

// ListenWith is Listen with options.
func ListenWith(network, address string, opts Options) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("pgproxy: listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{network: network, address: address, delay: opts.Delay, ln: ln, ctx: ctx, cancel: cancel,
		links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Start starts a proxy to the server connString names, closed when t ends,
// and returns it with connString routed through it: the same database,
// user and settings, the proxy's host and port.
func Start(t testing.TB, connString string) (*Proxy, string) {
	t.Helper()
	p, routed, err := For(connString, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, routed
}

// For starts a proxy to the server connString names and returns it with
// connString routed through it: the same database, user and settings, the
// proxy's host and port. The caller closes it.
func For(connString string, opts Options) (*Proxy, string, error) {
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		return nil, "", fmt.Errorf("pgproxy: %w", err)
	}
	network, address := "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if strings.HasPrefix(cfg.Host, "/") {
		network, address = "unix", filepath.Join(cfg.Host, ".s.PGSQL."+strconv.Itoa(int(cfg.Port)))
	}
	p, err := ListenWith(network, address, opts)
	if err != nil {
		return nil, "", err
	}
	return p, p.route(connString), nil
}

// Addr returns the host:port the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// route returns connString with its host and port replaced by the proxy's.
func (p *Proxy) route(connString string) string {
	host, port, _ := net.SplitHostPort(p.Addr())
	if u, err := url.Parse(connString); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Host = p.Addr()
		q := u.Query()
		q.Del("host")
		q.Del("port")
		u.RawQuery = q.Encode()
		return u.String()
	}
	// In keyword/value form the last setting wins.
	return connString + " host=" + host + " port=" + port
}

// Arm puts r in force: the next statements it matches, on any connection,
// are faulted.
func (p *Proxy) Arm(r Rule) *Armed {
	if r.Match == nil || (r.Fault != LoseAcknowledgement && r.Fault != LoseRequest) {
		panic("pgproxy: a rule needs a Match and a Fault")
	}
	a := &Armed{rule: r, skip: r.Skip, left: max(r.Times, 1)}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules = append(p.rules, a)
	return a
}

// match returns the armed rule that faults a statement with this text, and
// counts the match; nil when none does.
func (p *Proxy) match(sql string) *Armed {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, a := range p.rules {
		if !a.rule.Match(sql) {
			continue
		}
		if a.skip > 0 {
			a.skip--
			continue
		}
		a.left--
		if a.left == 0 {
			p.rules = slices.Delete(p.rules, i, i+1)
		}
		return a
	}
	return nil
}

// Disarm takes a out of force, whether it fired or not.
func (p *Proxy) Disarm(a *Armed) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules = slices.DeleteFunc(p.rules, func(r *Armed) bool { return r == a })
}

// Close stops the proxy: it closes the listener and every connection, and
// returns once every goroutine it started has ended. It is safe to call
// twice.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	p.cancel()
	_ = p.ln.Close()
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
}

// accept hands each connection to a link of its own until the listener
// closes.
func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		conn, err := p.ln.Accept()
		if err != nil {
			return
		}
		l := &link{p: p, client: conn, statements: map[string]string{}}
		if !p.add(l) {
			_ = conn.Close()
			return
		}
		go l.serve()
	}
}

// add registers l and counts its goroutine, unless the proxy is closed.
func (p *Proxy) add(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.links[l] = struct{}{}
	p.wg.Add(1)
	return true
}

func (p *Proxy) remove(l *link) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.links, l)
}

// dial connects to the server.
func (p *Proxy) dial() (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(p.ctx, p.network, p.address)
	if err != nil {
		return nil, fmt.Errorf("pgproxy: dial %s: %w", p.address, err)
	}
	return delay(conn, p.delay, &p.wg), nil
}
