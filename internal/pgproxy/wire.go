package pgproxy

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
)

// Startup packet codes that are not a protocol version (PostgreSQL's
// pqcomm.h).
const (
	cancelRequestCode = 80877102
	sslRequestCode    = 80877103
	gssEncRequestCode = 80877104
)

// maxMessage bounds a message's length, as the server bounds what it reads.
const maxMessage = 1 << 30

// message is one typed protocol message, kept as it came in.
type message struct {
	typ byte
	raw []byte // the whole message: type, length and body
}

// body returns the message after its type and length.
func (m message) body() []byte { return m.raw[5:] }

// endsRoundTrip reports a frontend message the server answers with a
// ReadyForQuery: a Sync, a simple Query or a FunctionCall.
func (m message) endsRoundTrip() bool { return m.typ == 'S' || m.typ == 'Q' || m.typ == 'F' }

// waitsForReply reports whether a client may wait for replies after this
// frontend message. Parse, Bind, Describe, Execute and Close are answered
// only after a later Sync or Flush, so the proxy holds them until then and
// judges the whole round trip before any of it reaches the server; anything
// else (Sync, Flush, Query, CopyData, a password...) passes at once.
func (m message) waitsForReply() bool {
	switch m.typ {
	case 'P', 'B', 'D', 'E', 'C':
		return false
	}
	return true
}

// readMessage reads one typed message.
func readMessage(r *bufio.Reader) (message, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return message{}, err
	}
	n := int(binary.BigEndian.Uint32(head[1:]))
	if n < 4 || n > maxMessage {
		return message{}, fmt.Errorf("message %q has length %d", head[0], n)
	}
	raw := make([]byte, 1+n)
	copy(raw, head[:])
	if _, err := io.ReadFull(r, raw[5:]); err != nil {
		return message{}, err
	}
	return message{typ: head[0], raw: raw}, nil
}

// readUnit reads frontend messages up to and including the first one after
// which the client may wait for a reply.
func readUnit(r *bufio.Reader) ([]message, error) {
	var unit []message
	for {
		m, err := readMessage(r)
		if err != nil {
			return nil, err
		}
		unit = append(unit, m)
		if m.waitsForReply() {
			return unit, nil
		}
	}
}

// readStartup reads an untyped startup packet (a StartupMessage,
// SSLRequest, GSSENCRequest or CancelRequest) and returns it with its code.
func readStartup(r io.Reader) (raw []byte, code uint32, err error) {
	var head [8]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, 0, err
	}
	n := int(binary.BigEndian.Uint32(head[:4]))
	if n < 8 || n > 10000 {
		return nil, 0, fmt.Errorf("startup packet has length %d", n)
	}
	raw = make([]byte, n)
	copy(raw, head[:])
	if _, err := io.ReadFull(r, raw[8:]); err != nil {
		return nil, 0, err
	}
	return raw, binary.BigEndian.Uint32(head[4:]), nil
}
