package pgproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"

	"github.com/jackc/pgx/v5/pgproto3"
)

// errCancelForwarded ends a link that carried a CancelRequest.
var errCancelForwarded = errors.New("pgproxy: cancel request forwarded")

// link is one client connection and its connection to the server: one
// goroutine forwards what the client sends (frontend), another what the
// server answers (backend).
type link struct {
	p      *Proxy
	client net.Conn

	// The frontend goroutine's own.
	statements map[string]string // prepared statement name -> SQL text
	ends       int               // messages forwarded that the server ends a round trip of

	mu     sync.Mutex
	server net.Conn // nil until dialled
	closed bool
	// cut, when not 0, numbers the round trip (by the ReadyForQuery that
	// ends it) whose replies a lost acknowledgement drops; ack is its rule.
	cut int
	ack *Armed
}

// serve runs the link until either side closes or a rule ends it.
func (l *link) serve() {
	defer l.p.wg.Done()
	defer l.p.remove(l)
	defer l.close()
	if !l.delayClient() {
		return
	}
	r := bufio.NewReader(l.client)
	server, err := l.start(r)
	if err != nil {
		return
	}
	l.p.wg.Add(1)
	go func() {
		defer l.p.wg.Done()
		defer l.close()
		l.backend(server)
	}()
	l.frontend(r, server)
}

// start reads the client's startup packets, refusing encryption, and
// forwards the StartupMessage to a new server connection, which it
// returns. A CancelRequest is forwarded on a connection of its own, and
// ends the link.
func (l *link) start(r *bufio.Reader) (net.Conn, error) {
	for {
		raw, code, err := readStartup(r)
		if err != nil {
			return nil, err
		}
		if code == sslRequestCode || code == gssEncRequestCode {
			if _, err := l.client.Write([]byte{'N'}); err != nil {
				return nil, err
			}
			continue
		}
		server, err := l.connect()
		if err != nil {
			return nil, err
		}
		if _, err := server.Write(raw); err != nil {
			return nil, err
		}
		if code == cancelRequestCode {
			// The server closes the connection once it has read the
			// request; the client waits for that.
			_, _ = io.Copy(l.client, server)
			return nil, errCancelForwarded
		}
		l.ends = 1 // the server ends the startup with a ReadyForQuery
		return server, nil
	}
}

// delayClient delays what the link writes to the client by the proxy's
// delay, unless the link was closed.
func (l *link) delayClient() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.client = delay(l.client, l.p.delay, &l.p.wg)
	return true
}

// connect dials the server for the link, unless the link was closed.
func (l *link) connect() (net.Conn, error) {
	server, err := l.p.dial()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = server.Close()
		return nil, net.ErrClosed
	}
	l.server = server
	return server, nil
}

// frontend forwards the client's messages, a round trip's worth at a time,
// as the armed rules allow.
func (l *link) frontend(r *bufio.Reader, server net.Conn) {
	for {
		unit, err := readUnit(r)
		if err != nil {
			return
		}
		out, lost := l.judge(unit)
		if len(out) > 0 {
			_, err = server.Write(out)
		}
		if lost != nil {
			lost.fired.Add(1)
			return // serve closes both connections
		}
		if err != nil {
			return
		}
	}
}

// judge returns the bytes of unit that go to the server. When a rule loses
// the request of one of its statements, judge stops before that statement
// and returns the rule too. When a rule loses a statement's
// acknowledgement, everything up to the end of the statement's round trip
// goes, and nothing after it ever does.
func (l *link) judge(unit []message) (out []byte, lost *Armed) {
	for _, m := range unit {
		cut, _ := l.lostAck()
		if cut != 0 && l.ends >= cut {
			break
		}
		if sql, ok := l.executes(m); ok && cut == 0 {
			if a := l.p.match(sql); a != nil {
				if a.rule.Fault == LoseRequest {
					return out, a
				}
				l.loseAck(l.ends+1, a)
			}
		}
		out = append(out, m.raw...)
		if m.endsRoundTrip() {
			l.ends++
		}
	}
	return out, nil
}

// executes returns the SQL text m executes, if it executes one: a Query's,
// or the statement a Bind binds, as the connection's Parse messages named
// it. It keeps track of the prepared statements as it goes.
func (l *link) executes(m message) (string, bool) {
	switch m.typ {
	case 'Q':
		var q pgproto3.Query
		if q.Decode(m.body()) == nil {
			return q.String, true
		}
	case 'P':
		var p pgproto3.Parse
		if p.Decode(m.body()) == nil {
			l.statements[p.Name] = p.Query
		}
	case 'B':
		var b pgproto3.Bind
		if b.Decode(m.body()) == nil {
			sql, ok := l.statements[b.PreparedStatement]
			return sql, ok
		}
	case 'C':
		var c pgproto3.Close
		if c.Decode(m.body()) == nil && c.ObjectType == 'S' {
			delete(l.statements, c.Name)
		}
	}
	return "", false
}

// backend forwards the server's messages to the client, but drops the
// replies of a round trip whose acknowledgement a rule loses, and ends the
// link once the server has finished that round trip.
func (l *link) backend(server net.Conn) {
	r := bufio.NewReader(server)
	w := bufio.NewWriter(l.client)
	ready := 0 // ReadyForQuery messages read
	for {
		m, err := readMessage(r)
		if err != nil {
			_ = w.Flush()
			return
		}
		cut, ack := l.lostAck()
		if cut == 0 || ready+1 < cut {
			if _, err := w.Write(m.raw); err != nil {
				return
			}
		}
		if m.typ == 'Z' {
			ready++
			if ready == cut {
				_ = w.Flush() // the replies of the round trips before
				ack.fired.Add(1)
				return // serve closes both connections
			}
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

// loseAck makes the backend drop the replies of round trip cut.
func (l *link) loseAck(cut int, a *Armed) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut, l.ack = cut, a
}

func (l *link) lostAck() (int, *Armed) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cut, l.ack
}

// close closes both connections; it is safe to call more than once.
func (l *link) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	_ = l.client.Close()
	if l.server != nil {
		_ = l.server.Close()
	}
}
