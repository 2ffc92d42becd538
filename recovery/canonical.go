package recovery

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxJSONDepth is how deeply arrays and objects may nest in a request that is
// fingerprinted.
const MaxJSONDepth = 512

// ErrInvalidJSON reports a request that is not one well-formed JSON value;
// *JSONError says where.
var ErrInvalidJSON = errors.New("invalid JSON")

// JSONError is the ErrInvalidJSON Canonicalize returns, with the byte offset
// of the problem.
type JSONError struct {
	Offset  int
	Problem string
}

func (e *JSONError) Error() string {
	return fmt.Sprintf("%v at byte %d: %s", ErrInvalidJSON, e.Offset, e.Problem)
}

// Is makes errors.Is(err, ErrInvalidJSON) true.
func (e *JSONError) Is(target error) bool { return target == ErrInvalidJSON }

// Canonicalize appends the canonical form of the JSON document src to dst.
// Two documents that mean the same value have the same canonical form:
//
//   - no insignificant whitespace;
//   - object members sorted by their canonical key bytes; a key appearing
//     twice in one object is an error, since its meaning is ambiguous;
//   - numbers written as the shortest exact decimal: 1, 1.0, 10e-1 and 1e0
//     are all "1"; -0 is "0"; large and small magnitudes use an exponent
//     as JavaScript would ("1e+21", "1e-7"); the value is never rounded;
//   - strings in one escaping: only '"', '\' and control characters are
//     escaped, everything else is literal UTF-8; a lone UTF-16 surrogate
//     escape is kept as a lowercase \u escape.
//
// Canonicalize is idempotent. Invalid UTF-8, nesting deeper than
// MaxJSONDepth and trailing data are errors.
func Canonicalize(dst, src []byte) ([]byte, error) {
	c := canonicalizer{src: src, dst: dst}
	c.skipSpace()
	if err := c.value(0); err != nil {
		return nil, err
	}
	c.skipSpace()
	if c.pos != len(c.src) {
		return nil, c.fail("data after the JSON value")
	}
	return c.dst, nil
}

type canonicalizer struct {
	src     []byte
	pos     int
	dst     []byte
	members []member // reused stack of object members being sorted
}

// member locates one object member already written to dst.
type member struct{ keyStart, keyEnd, end int }

func (c *canonicalizer) fail(problem string) error {
	return &JSONError{Offset: c.pos, Problem: problem}
}

func (c *canonicalizer) skipSpace() {
	for c.pos < len(c.src) {
		switch c.src[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *canonicalizer) value(depth int) error {
	if c.pos >= len(c.src) {
		return c.fail("unexpected end of input")
	}
	switch ch := c.src[c.pos]; {
	case ch == '{':
		return c.object(depth + 1)
	case ch == '[':
		return c.array(depth + 1)
	case ch == '"':
		return c.string()
	case ch == '-' || (ch >= '0' && ch <= '9'):
		return c.number()
	case ch == 't':
		return c.literal("true")
	case ch == 'f':
		return c.literal("false")
	case ch == 'n':
		return c.literal("null")
	default:
		return c.fail(fmt.Sprintf("unexpected character %q", ch))
	}
}

func (c *canonicalizer) literal(word string) error {
	if !bytes.HasPrefix(c.src[c.pos:], []byte(word)) {
		return c.fail("invalid literal")
	}
	c.pos += len(word)
	c.dst = append(c.dst, word...)
	return nil
}

// open consumes an array's or object's opening bracket and reports whether
// the container is empty, in which case it is written whole.
func (c *canonicalizer) open(depth int, opening, closing byte) (empty bool, err error) {
	if depth > MaxJSONDepth {
		return false, c.fail(fmt.Sprintf("nested deeper than %d", MaxJSONDepth))
	}
	c.pos++
	c.dst = append(c.dst, opening)
	c.skipSpace()
	if c.pos < len(c.src) && c.src[c.pos] == closing {
		c.pos++
		c.dst = append(c.dst, closing)
		return true, nil
	}
	return false, nil
}

func (c *canonicalizer) array(depth int) error {
	if empty, err := c.open(depth, '[', ']'); empty || err != nil {
		return err
	}
	for {
		c.skipSpace()
		if err := c.value(depth); err != nil {
			return err
		}
		c.skipSpace()
		if c.pos >= len(c.src) {
			return c.fail("unterminated array")
		}
		switch c.src[c.pos] {
		case ',':
			c.pos++
			c.dst = append(c.dst, ',')
		case ']':
			c.pos++
			c.dst = append(c.dst, ']')
			return nil
		default:
			return c.fail("expected ',' or ']' in array")
		}
	}
}

// object writes the members as they come, then reorders them in place.
func (c *canonicalizer) object(depth int) error {
	if empty, err := c.open(depth, '{', '}'); empty || err != nil {
		return err
	}
	start := len(c.dst)
	base := len(c.members)
	defer func() { c.members = c.members[:base] }()
	for {
		c.skipSpace()
		if c.pos >= len(c.src) || c.src[c.pos] != '"' {
			return c.fail("expected a string key in object")
		}
		keyStart := len(c.dst)
		if err := c.string(); err != nil {
			return err
		}
		keyEnd := len(c.dst)
		c.skipSpace()
		if c.pos >= len(c.src) || c.src[c.pos] != ':' {
			return c.fail("expected ':' after object key")
		}
		c.pos++
		c.dst = append(c.dst, ':')
		c.skipSpace()
		if err := c.value(depth); err != nil {
			return err
		}
		c.members = append(c.members, member{keyStart, keyEnd, len(c.dst)})
		c.skipSpace()
		if c.pos >= len(c.src) {
			return c.fail("unterminated object")
		}
		switch c.src[c.pos] {
		case ',':
			c.pos++
		case '}':
			c.pos++
			return c.sortMembers(start, c.members[base:])
		default:
			return c.fail("expected ',' or '}' in object")
		}
	}
}

// sortMembers rewrites dst[start:] (members written back to back) as the
// members sorted by key and joined by commas, then closes the object.
func (c *canonicalizer) sortMembers(start int, ms []member) error {
	written := c.dst[start:]
	key := func(m member) []byte { return c.dst[m.keyStart:m.keyEnd] }
	slices.SortFunc(ms, func(a, b member) int { return bytes.Compare(key(a), key(b)) })
	for i := 1; i < len(ms); i++ {
		if bytes.Equal(key(ms[i-1]), key(ms[i])) {
			return c.fail(fmt.Sprintf("duplicate object key %s", key(ms[i])))
		}
	}
	sorted := make([]byte, 0, len(written)+len(ms))
	for i, m := range ms {
		if i > 0 {
			sorted = append(sorted, ',')
		}
		sorted = append(sorted, c.dst[m.keyStart:m.end]...)
	}
	c.dst = append(append(c.dst[:start], sorted...), '}')
	return nil
}

func (c *canonicalizer) string() error {
	c.pos++ // opening quote
	c.dst = append(c.dst, '"')
	for {
		if c.pos >= len(c.src) {
			return c.fail("unterminated string")
		}
		ch := c.src[c.pos]
		switch {
		case ch == '"':
			c.pos++
			c.dst = append(c.dst, '"')
			return nil
		case ch == '\\':
			if err := c.escape(); err != nil {
				return err
			}
		case ch < 0x20:
			return c.fail("control character in string")
		case ch < utf8.RuneSelf:
			c.pos++
			c.dst = append(c.dst, ch)
		default:
			r, size := utf8.DecodeRune(c.src[c.pos:])
			if r == utf8.RuneError && size == 1 {
				return c.fail("invalid UTF-8 in string")
			}
			c.dst = append(c.dst, c.src[c.pos:c.pos+size]...)
			c.pos += size
		}
	}
}

// escape decodes one backslash escape and writes the rune canonically.
func (c *canonicalizer) escape() error {
	if c.pos+1 >= len(c.src) {
		return c.fail("unterminated escape")
	}
	esc := c.src[c.pos+1]
	c.pos += 2
	switch esc {
	case '"', '\\', '/':
		c.writeRune(rune(esc))
	case 'b':
		c.writeRune('\b')
	case 'f':
		c.writeRune('\f')
	case 'n':
		c.writeRune('\n')
	case 'r':
		c.writeRune('\r')
	case 't':
		c.writeRune('\t')
	case 'u':
		r, err := c.hex4()
		if err != nil {
			return err
		}
		if utf16.IsSurrogate(r) {
			if r < 0xDC00 && bytes.HasPrefix(c.src[c.pos:], []byte(`\u`)) {
				save := c.pos
				c.pos += 2
				low, err := c.hex4()
				if err != nil {
					return err
				}
				if pair := utf16.DecodeRune(r, low); pair != utf8.RuneError {
					c.writeRune(pair)
					return nil
				}
				c.pos = save // not a pair: the next escape stands alone
			}
			c.dst = fmt.Appendf(c.dst, `\u%04x`, r)
			return nil
		}
		c.writeRune(r)
	default:
		c.pos--
		return c.fail(fmt.Sprintf("invalid escape \\%c", esc))
	}
	return nil
}

func (c *canonicalizer) hex4() (rune, error) {
	if c.pos+4 > len(c.src) {
		return 0, c.fail("short \\u escape")
	}
	n, err := strconv.ParseUint(string(c.src[c.pos:c.pos+4]), 16, 32)
	if err != nil {
		return 0, c.fail("invalid \\u escape")
	}
	c.pos += 4
	return rune(n), nil
}

// writeRune writes r in the canonical escaping.
func (c *canonicalizer) writeRune(r rune) {
	switch {
	case r == '"':
		c.dst = append(c.dst, '\\', '"')
	case r == '\\':
		c.dst = append(c.dst, '\\', '\\')
	case r == '\b':
		c.dst = append(c.dst, '\\', 'b')
	case r == '\f':
		c.dst = append(c.dst, '\\', 'f')
	case r == '\n':
		c.dst = append(c.dst, '\\', 'n')
	case r == '\r':
		c.dst = append(c.dst, '\\', 'r')
	case r == '\t':
		c.dst = append(c.dst, '\\', 't')
	case r < 0x20:
		c.dst = fmt.Appendf(c.dst, `\u%04x`, r)
	default:
		c.dst = utf8.AppendRune(c.dst, r)
	}
}
