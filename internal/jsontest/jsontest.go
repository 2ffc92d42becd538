// Package jsontest holds JSON helpers for tests: respell a document without
// changing what it means.
//
// Read decodes a document with encoding/json, not with onceflow, keeping the
// order of object members and the spelling of numbers, and notes what makes
// its meaning unclear (a key twice in one object, a lone surrogate escape).
// Doc.Respell then writes it another way: members in reverse order, other
// whitespace, strings escaped as encoding/json escapes them, numbers with an
// exponent. A test sends both spellings and checks that onceflow sees one
// request.
package jsontest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ErrInvalid reports a document that is not one well-formed JSON value in
// valid UTF-8 (encoding/json lets invalid UTF-8 through; Read does not).
var ErrInvalid = errors.New("not JSON")

// ErrTooDeep reports a document whose arrays and objects nest more deeply
// than Read was allowed.
var ErrTooDeep = errors.New("JSON nests too deeply")

// Member is an object member. A Doc's Value is made of nil, bool, string,
// json.Number, []any (arrays) and []Member (objects, in the order written).
type Member struct {
	Key   string
	Value any
}

// Doc is a document Read decoded: its value and what Read learned about its
// spelling.
type Doc struct {
	Value any

	// DuplicateKey is set when an object holds a key twice, once decoded
	// ("a" and "\u0061" are the same key).
	DuplicateKey bool

	// Replacement is set when a string or key holds U+FFFD, which a lone
	// surrogate escape decodes to, so that its spelling is lost.
	Replacement bool

	// BigExponent is set when a number's exponent is 10^8 or more.
	BigExponent bool
}

// Read decodes one JSON value with encoding/json, keeping the order of
// members and the spelling of numbers. A document that is not JSON or not
// UTF-8 is ErrInvalid; one whose arrays and objects nest more than maxDepth
// deep ([[1]] is 2 deep, 1 is 0) is ErrTooDeep.
func Read(body []byte, maxDepth int) (*Doc, error) {
	if !json.Valid(body) {
		return nil, fmt.Errorf("%w: %.40q", ErrInvalid, body)
	}
	if !utf8.Valid(body) {
		return nil, fmt.Errorf("%w: invalid UTF-8", ErrInvalid)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	r := reader{dec: dec, maxDepth: maxDepth}
	v, err := r.value(0)
	if err != nil {
		return nil, err
	}
	r.doc.Value = v
	return &r.doc, nil
}

type reader struct {
	dec      *json.Decoder
	maxDepth int
	doc      Doc
}

func (r *reader) value(depth int) (any, error) {
	tok, err := r.dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok := tok.(type) {
	case json.Delim:
		if depth+1 > r.maxDepth {
			return nil, fmt.Errorf("%w: more than %d", ErrTooDeep, r.maxDepth)
		}
		if tok == '[' {
			return r.array(depth + 1)
		}
		return r.object(depth + 1)
	case string:
		r.doc.Replacement = r.doc.Replacement || strings.ContainsRune(tok, utf8.RuneError)
	case json.Number:
		_, exp, _ := strings.Cut(strings.ToLower(string(tok)), "e")
		r.doc.BigExponent = r.doc.BigExponent || len(strings.TrimLeft(exp, "+-0")) > 8
	}
	return tok, nil
}

func (r *reader) array(depth int) (any, error) {
	items := []any{}
	for r.dec.More() {
		v, err := r.value(depth)
		if err != nil {
			return nil, err
		}
		items = append(items, v)
	}
	_, err := r.dec.Token()
	return items, err
}

func (r *reader) object(depth int) (any, error) {
	members := []Member{}
	seen := map[string]bool{}
	for r.dec.More() {
		tok, err := r.dec.Token()
		if err != nil {
			return nil, err
		}
		key := tok.(string)
		r.doc.Replacement = r.doc.Replacement || strings.ContainsRune(key, utf8.RuneError)
		r.doc.DuplicateKey = r.doc.DuplicateKey || seen[key]
		seen[key] = true
		v, err := r.value(depth)
		if err != nil {
			return nil, err
		}
		members = append(members, Member{key, v})
	}
	_, err := r.dec.Token()
	return members, err
}

// Respell writes the document another way with the same meaning: members
// in reverse order, other whitespace (spaces, tabs, CR and LF, before and
// after the value), strings escaped as encoding/json escapes them (<, > and
// & as \u escapes), numbers with an exponent (1 as 1E+00). ok is false,
// and there is no variant, where the meaning would not survive: a key
// twice in one object (reversed, another one wins) or U+FFFD in a string
// (the lone surrogate it may stand for is lost).
func (d *Doc) Respell() (variant []byte, ok bool) {
	if d.DuplicateKey || d.Replacement {
		return nil, false
	}
	var b bytes.Buffer
	b.WriteString(" \r\n")
	writeRespelled(&b, d.Value, "\n")
	b.WriteString("\t")
	return b.Bytes(), true
}

func writeRespelled(b *bytes.Buffer, v any, indent string) {
	switch v := v.(type) {
	case []Member:
		b.WriteString("{")
		for i := len(v) - 1; i >= 0; i-- {
			b.WriteString(indent + " ")
			writeRespelled(b, v[i].Key, "")
			b.WriteString(" :\t")
			writeRespelled(b, v[i].Value, indent+" ")
			if i > 0 {
				b.WriteString(",")
			}
		}
		b.WriteString(indent + "}")
	case []any:
		b.WriteString("[ ")
		for i, item := range v {
			if i > 0 {
				b.WriteString(" ,\r\n")
			}
			writeRespelled(b, item, indent+" ")
		}
		b.WriteString(" ]")
	case json.Number:
		b.WriteString(string(v))
		if !strings.ContainsAny(string(v), "eE") {
			b.WriteString("E+00")
		}
	default: // nil, bool, string
		enc, _ := json.Marshal(v)
		b.Write(enc)
	}
}
