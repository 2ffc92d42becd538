package canonjson

import (
	"encoding/json"
	"unicode"
	"unicode/utf8"
)

// NamesCollide reports whether an object of the JSON document doc has two
// member names that encoding/json reads as one, and doc's meaning to it
// therefore depends on the members' order, which the canonical form does
// not keep: it sets a struct's field from the last member whose name
// matches. Two names collide when they are equal once decoded as
// encoding/json decodes them (a lone surrogate escape is U+FFFD to it)
// and folded as it matches names to fields, without regard to case by
// Unicode simple folding ("amount", "AMOUNT" and "Amount" are one name,
// "k" and the Kelvin sign too). Names differing in case are distinct map
// keys, but a reader of the bytes alone cannot tell a map from a struct.
// It returns the error Append would for a document that is not JSON.
func NamesCollide(doc []byte) (bool, error) {
	p := parser{src: doc}
	p.skipSpace()
	if _, err := p.value(0); err != nil {
		return false, err
	}
	if p.skipSpace(); p.pos != len(p.src) {
		return false, p.fail(p.pos, "data after the JSON value")
	}
	var folded []byte
	for _, n := range p.nodes {
		if n.kind != '{' || n.hi-n.lo < 4 { // fewer than two members
			continue
		}
		seen := make(map[string]struct{}, (n.hi-n.lo)/2)
		for i := n.lo; i < n.hi; i += 2 {
			k := p.nodes[p.kids[i]]
			folded = foldName(folded[:0], p.buf[k.lo:k.hi])
			if _, ok := seen[string(folded)]; ok {
				return true, nil
			}
			seen[string(folded)] = struct{}{}
		}
	}
	return false, nil
}

// foldName appends to dst the name that the JSON string quoted (its
// quotes included, valid UTF-8) is to encoding/json when it matches names
// to fields: decoded, ASCII letters upper-cased, any other rune replaced by
// the smallest of its simple-folding orbit.
func foldName(dst, quoted []byte) []byte {
	name := string(quoted[1 : len(quoted)-1])
	for i := range len(name) {
		if name[i] == '\\' { // an escape: decode as encoding/json does
			_ = json.Unmarshal(quoted, &name) // quoted is valid JSON: it parsed
			break
		}
	}
	for _, r := range name {
		switch {
		case 'a' <= r && r <= 'z':
			r -= 'a' - 'A'
		case r >= utf8.RuneSelf:
			r = smallestFold(r)
		}
		dst = utf8.AppendRune(dst, r)
	}
	return dst
}

// smallestFold returns the smallest rune of r's simple-folding orbit.
func smallestFold(r rune) rune {
	smallest := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		smallest = min(smallest, f)
	}
	return smallest
}
