// Package canonjson writes a JSON document in its canonical form, so that
// two documents meaning the same value are byte for byte equal.
//
// The canonical form has no insignificant whitespace; object members sorted
// by their canonical key bytes (a key appearing twice in one object is an
// error, since its meaning is ambiguous); numbers as the shortest exact
// decimal (1, 1.0, 10e-1 and 1e0 are all "1"; -0 is "0"; large and small
// magnitudes use an exponent as JavaScript would, "1e+21", "1e-7"; nothing
// is ever rounded); and strings in one escaping: only '"', '\' and control
// characters are escaped, everything else is literal UTF-8, and a lone
// UTF-16 surrogate escape is kept as a lowercase \u escape.
//
// Append is idempotent and linear in its input: it parses the document into
// spans once and writes each byte of output once.
package canonjson

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth is how deeply arrays and objects may nest.
const MaxDepth = 512

// ErrInvalid reports a document that is not one well-formed JSON value, or
// one this package refuses (duplicate keys, deeper than MaxDepth, an
// exponent beyond ±10^9); *Error says where.
var ErrInvalid = errors.New("invalid JSON")

// Error is the ErrInvalid Append returns, with the byte offset of the
// problem.
type Error struct {
	Offset  int
	Problem string
}

// Error describes the problem and where it is.
func (e *Error) Error() string {
	return fmt.Sprintf("%v at byte %d: %s", ErrInvalid, e.Offset, e.Problem)
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// Append appends the canonical form of the JSON document src to dst.
func Append(dst, src []byte) ([]byte, error) {
	p := parser{src: src}
	p.skipSpace()
	root, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.src) {
		return nil, p.fail(p.pos, "data after the JSON value")
	}
	for i := range p.nodes {
		if n := &p.nodes[i]; n.kind == '{' {
			if err := p.sortMembers(n); err != nil {
				return nil, err
			}
		}
	}
	return p.emit(dst, root), nil
}

// node is one parsed value. A scalar's canonical bytes are buf[lo:hi]; a
// container's children are kids[lo:hi], and an object's children alternate
// key, value.
type node struct {
	kind   byte // '{', '[' or 0 for a scalar
	lo, hi int
	at     int // offset in src, for errors
}

type parser struct {
	src   []byte
	pos   int
	buf   []byte // canonical scalars, back to back
	nodes []node
	kids  []int // children of containers, each container's contiguous
	stack []int // children of the containers being parsed
}

func (p *parser) fail(at int, problem string) error { return &Error{Offset: at, Problem: problem} }

func (p *parser) skipSpace() {
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// value parses one value and returns its node index.
func (p *parser) value(depth int) (int, error) {
	if p.pos >= len(p.src) {
		return 0, p.fail(p.pos, "unexpected end of input")
	}
	switch ch := p.src[p.pos]; {
	case ch == '{' || ch == '[':
		return p.container(depth+1, ch)
	case ch == '"':
		return p.scalar(p.string)
	case ch == '-' || (ch >= '0' && ch <= '9'):
		return p.scalar(p.number)
	case ch == 't':
		return p.scalar(func() error { return p.literal("true") })
	case ch == 'f':
		return p.scalar(func() error { return p.literal("false") })
	case ch == 'n':
		return p.scalar(func() error { return p.literal("null") })
	default:
		return 0, p.fail(p.pos, fmt.Sprintf("unexpected character %q", ch))
	}
}

// scalar runs parse, which appends canonical bytes to buf, and records them.
func (p *parser) scalar(parse func() error) (int, error) {
	at, lo := p.pos, len(p.buf)
	if err := parse(); err != nil {
		return 0, err
	}
	p.nodes = append(p.nodes, node{lo: lo, hi: len(p.buf), at: at})
	return len(p.nodes) - 1, nil
}

func (p *parser) literal(word string) error {
	if !bytes.HasPrefix(p.src[p.pos:], []byte(word)) {
		return p.fail(p.pos, "invalid literal")
	}
	p.pos += len(word)
	p.buf = append(p.buf, word...)
	return nil
}

// container parses an array or an object; open is '[' or '{'.
func (p *parser) container(depth int, open byte) (int, error) {
	at := p.pos
	if depth > MaxDepth {
		return 0, p.fail(at, fmt.Sprintf("nested deeper than %d", MaxDepth))
	}
	closing, what := byte(']'), "array"
	if open == '{' {
		closing, what = '}', "object"
	}
	p.pos++
	base := len(p.stack)
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == closing {
		p.pos++
		return p.closeContainer(open, at, base), nil
	}
	for {
		p.skipSpace()
		if open == '{' {
			if err := p.key(); err != nil {
				return 0, err
			}
		}
		child, err := p.value(depth)
		if err != nil {
			return 0, err
		}
		p.stack = append(p.stack, child)
		p.skipSpace()
		if p.pos >= len(p.src) {
			return 0, p.fail(p.pos, "unterminated "+what)
		}
		switch p.src[p.pos] {
		case ',':
			p.pos++
		case closing:
			p.pos++
			return p.closeContainer(open, at, base), nil
		default:
			return 0, p.fail(p.pos, fmt.Sprintf("expected ',' or '%c' in %s", closing, what))
		}
	}
}

// key parses an object member's key and colon, leaving the key's node on
// the stack.
func (p *parser) key() error {
	if p.pos >= len(p.src) || p.src[p.pos] != '"' {
		return p.fail(p.pos, "expected a string key in object")
	}
	k, err := p.scalar(p.string)
	if err != nil {
		return err
	}
	p.stack = append(p.stack, k)
	p.skipSpace()
	if p.pos >= len(p.src) || p.src[p.pos] != ':' {
		return p.fail(p.pos, "expected ':' after object key")
	}
	p.pos++
	p.skipSpace()
	return nil
}

func (p *parser) closeContainer(kind byte, at, base int) int {
	lo := len(p.kids)
	p.kids = append(p.kids, p.stack[base:]...)
	p.stack = p.stack[:base]
	p.nodes = append(p.nodes, node{kind: kind, lo: lo, hi: len(p.kids), at: at})
	return len(p.nodes) - 1
}

// sortMembers orders an object's (key, value) pairs by key bytes and
// rejects a key that appears twice.
func (p *parser) sortMembers(n *node) error {
	pairs := make([][2]int, 0, (n.hi-n.lo)/2)
	for i := n.lo; i < n.hi; i += 2 {
		pairs = append(pairs, [2]int{p.kids[i], p.kids[i+1]})
	}
	key := func(pair [2]int) []byte { k := p.nodes[pair[0]]; return p.buf[k.lo:k.hi] }
	slices.SortStableFunc(pairs, func(a, b [2]int) int { return bytes.Compare(key(a), key(b)) })
	for i, pair := range pairs {
		if i > 0 && bytes.Equal(key(pairs[i-1]), key(pair)) {
			return p.fail(p.nodes[pair[0]].at, fmt.Sprintf("duplicate object key %s", key(pair)))
		}
		p.kids[n.lo+2*i], p.kids[n.lo+2*i+1] = pair[0], pair[1]
	}
	return nil
}

// emit writes node i and everything below it.
func (p *parser) emit(dst []byte, i int) []byte {
	n := p.nodes[i]
	switch n.kind {
	case 0:
		return append(dst, p.buf[n.lo:n.hi]...)
	case '[':
		dst = append(dst, '[')
		for j := n.lo; j < n.hi; j++ {
			if j > n.lo {
				dst = append(dst, ',')
			}
			dst = p.emit(dst, p.kids[j])
		}
		return append(dst, ']')
	default:
		dst = append(dst, '{')
		for j := n.lo; j < n.hi; j += 2 {
			if j > n.lo {
				dst = append(dst, ',')
			}
			dst = append(p.emit(dst, p.kids[j]), ':')
			dst = p.emit(dst, p.kids[j+1])
		}
		return append(dst, '}')
	}
}

func (p *parser) string() error {
	p.pos++ // opening quote
	p.buf = append(p.buf, '"')
	for {
		if p.pos >= len(p.src) {
			return p.fail(p.pos, "unterminated string")
		}
		ch := p.src[p.pos]
		switch {
		case ch == '"':
			p.pos++
			p.buf = append(p.buf, '"')
			return nil
		case ch == '\\':
			if err := p.escape(); err != nil {
				return err
			}
		case ch < 0x20:
			return p.fail(p.pos, "control character in string")
		case ch < utf8.RuneSelf:
			p.pos++
			p.buf = append(p.buf, ch)
		default:
			r, size := utf8.DecodeRune(p.src[p.pos:])
			if r == utf8.RuneError && size == 1 {
				return p.fail(p.pos, "invalid UTF-8 in string")
			}
			p.buf = append(p.buf, p.src[p.pos:p.pos+size]...)
			p.pos += size
		}
	}
}

// escape decodes one backslash escape and writes the rune canonically.
func (p *parser) escape() error {
	if p.pos+1 >= len(p.src) {
		return p.fail(p.pos, "unterminated escape")
	}
	at, esc := p.pos, p.src[p.pos+1]
	p.pos += 2
	switch esc {
	case '"', '\\', '/':
		p.writeRune(rune(esc))
	case 'b':
		p.writeRune('\b')
	case 'f':
		p.writeRune('\f')
	case 'n':
		p.writeRune('\n')
	case 'r':
		p.writeRune('\r')
	case 't':
		p.writeRune('\t')
	case 'u':
		r, err := p.hex4()
		if err != nil {
			return err
		}
		if !utf16.IsSurrogate(r) {
			p.writeRune(r)
			return nil
		}
		if r < 0xDC00 && bytes.HasPrefix(p.src[p.pos:], []byte(`\u`)) {
			save := p.pos
			p.pos += 2
			low, err := p.hex4()
			if err != nil {
				return err
			}
			if pair := utf16.DecodeRune(r, low); pair != utf8.RuneError {
				p.writeRune(pair)
				return nil
			}
			p.pos = save // not a pair: the next escape stands alone
		}
		p.buf = fmt.Appendf(p.buf, `\u%04x`, r)
	default:
		return p.fail(at, fmt.Sprintf("invalid escape \\%c", esc))
	}
	return nil
}

func (p *parser) hex4() (rune, error) {
	if p.pos+4 > len(p.src) {
		return 0, p.fail(p.pos, "short \\u escape")
	}
	n, err := strconv.ParseUint(string(p.src[p.pos:p.pos+4]), 16, 32)
	if err != nil {
		return 0, p.fail(p.pos, "invalid \\u escape")
	}
	p.pos += 4
	return rune(n), nil
}

// writeRune writes r in the canonical escaping.
func (p *parser) writeRune(r rune) {
	switch {
	case r == '"':
		p.buf = append(p.buf, '\\', '"')
	case r == '\\':
		p.buf = append(p.buf, '\\', '\\')
	case r == '\b':
		p.buf = append(p.buf, '\\', 'b')
	case r == '\f':
		p.buf = append(p.buf, '\\', 'f')
	case r == '\n':
		p.buf = append(p.buf, '\\', 'n')
	case r == '\r':
		p.buf = append(p.buf, '\\', 'r')
	case r == '\t':
		p.buf = append(p.buf, '\\', 't')
	case r < 0x20:
		p.buf = fmt.Appendf(p.buf, `\u%04x`, r)
	default:
		p.buf = utf8.AppendRune(p.buf, r)
	}
}
