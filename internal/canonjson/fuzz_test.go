package canonjson_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/canonjson"
)

// FuzzCanonicalize checks, for any input Canonicalize accepts, that:
//   - the input is JSON by encoding/json's reading;
//   - canonicalizing is idempotent;
//   - rewriting the document with other key orders, whitespace, number
//     spellings and string escapes never changes the canonical form (and so
//     never changes a fingerprint).
//
// Run it longer with: go test ./internal/canonjson -run '^$' -fuzz FuzzCanonicalize
func FuzzCanonicalize(f *testing.F) {
	for _, seed := range []string{
		`{"b":1,"a":[1,2,{"d":null,"c":true}]}`,
		`[1, 1.0, 1e0, -0, 1e21, 1e-7, 0.000001, 123.456e-2]`,
		`"\u00e9\ud83d\ude00\ud800\/\n"`,
		`{"customer":"c-1","amount_cents":1999,"items":[{"sku":"a","qty":2}],"meta":{}}`,
		`{"a":{"a":{"a":[[[]]]}}}`,
		`{"a":1,"a":2}`,
		"\"\xff\"",
		`1e999999999`,
	} {
		f.Add([]byte(seed), uint64(1))
	}
	f.Fuzz(func(t *testing.T, data []byte, seed uint64) {
		canon, err := canonjson.Append(nil, data)
		if err != nil {
			if !errors.Is(err, canonjson.ErrInvalid) {
				t.Fatalf("error is not ErrInvalidJSON: %v", err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted input encoding/json rejects: %q", data)
		}
		if !json.Valid(canon) {
			t.Fatalf("canonical form is not JSON: %q", canon)
		}
		again, err := canonjson.Append(nil, canon)
		if err != nil {
			t.Fatalf("canonical form %q rejected: %v", canon, err)
		}
		if !bytes.Equal(canon, again) {
			t.Fatalf("not idempotent:\n%q\n%q", canon, again)
		}
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		for range 3 {
			variant := perturb(canon, rng)
			got, err := canonjson.Append(nil, variant)
			if err != nil {
				t.Fatalf("variant %q of %q rejected: %v", variant, canon, err)
			}
			if !bytes.Equal(got, canon) {
				t.Fatalf("canonical form changed:\n%q\n%q\n%q", canon, variant, got)
			}
		}
	})
}

// perturb rewrites a canonical JSON document as another spelling of the same
// value: members shuffled, whitespace added, numbers and strings respelled.
func perturb(canon []byte, rng *rand.Rand) []byte {
	p := perturber{src: canon, rng: rng}
	p.value()
	return p.out.Bytes()
}

type perturber struct {
	src []byte
	pos int
	out bytes.Buffer
	rng *rand.Rand
}

func (p *perturber) space() {
	p.out.WriteString([]string{"", " ", "\n  ", "\t", "\r\n"}[p.rng.IntN(5)])
}

func (p *perturber) value() {
	p.space()
	switch c := p.src[p.pos]; {
	case c == '{':
		p.object()
	case c == '[':
		p.array()
	case c == '"':
		p.out.Write(p.respellString(p.token()))
	case c == 't' || c == 'f' || c == 'n':
		p.out.Write(p.token())
	default:
		p.out.WriteString(p.respellNumber(string(p.token())))
	}
	p.space()
}

// token returns the scalar at pos (a canonical string, number or literal).
func (p *perturber) token() []byte {
	start := p.pos
	if p.src[p.pos] == '"' {
		p.pos++
		for p.src[p.pos] != '"' {
			if p.src[p.pos] == '\\' {
				p.pos++
			}
			p.pos++
		}
		p.pos++
		return p.src[start:p.pos]
	}
	for p.pos < len(p.src) && !strings.ContainsRune(",]}", rune(p.src[p.pos])) {
		p.pos++
	}
	return p.src[start:p.pos]
}

func (p *perturber) array() {
	p.pos++
	p.out.WriteByte('[')
	for first := true; p.src[p.pos] != ']'; first = false {
		if !first {
			p.pos++ // ,
			p.out.WriteByte(',')
		}
		p.value()
	}
	p.pos++
	p.out.WriteByte(']')
}

func (p *perturber) object() {
	p.pos++
	var members [][]byte
	for first := true; p.src[p.pos] != '}'; first = false {
		if !first {
			p.pos++ // ,
		}
		var m perturber
		m.rng, m.src = p.rng, p.src
		m.pos = p.pos
		m.space()
		m.out.Write(m.respellString(m.token()))
		m.space()
		m.pos++ // :
		m.out.WriteByte(':')
		m.value()
		p.pos = m.pos
		members = append(members, m.out.Bytes())
	}
	p.pos++
	p.rng.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
	p.out.WriteByte('{')
	p.out.Write(bytes.Join(members, []byte(",")))
	p.out.WriteByte('}')
}

// respellString escapes some plain ASCII characters as \u00XX.
func (p *perturber) respellString(s []byte) []byte {
	var b bytes.Buffer
	b.WriteByte('"')
	body := s[1 : len(s)-1]
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case c == '\\':
			n := 2
			if body[i+1] == 'u' {
				n = 6
			}
			b.Write(body[i : i+n])
			i += n - 1
		case c < 0x80 && p.rng.IntN(3) == 0:
			fmt.Fprintf(&b, `\u%04X`, c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.Bytes()
}

// respellNumber writes a canonical number another way with the same value.
func (p *perturber) respellNumber(n string) string {
	mantissa, exp, hasExp := strings.Cut(n, "e")
	if !strings.Contains(mantissa, ".") {
		mantissa += "."
	}
	mantissa += strings.Repeat("0", 1+p.rng.IntN(2))
	if !hasExp {
		exp = "0"
	}
	return mantissa + []string{"e", "E"}[p.rng.IntN(2)] + exp
}
