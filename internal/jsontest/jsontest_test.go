package jsontest_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/jsontest"
)

// decode reads doc as encoding/json does, with numbers made exact values
// (1 and 1E+00 are both 1/1), so that two spellings of one meaning compare
// equal.
func decode(t *testing.T, doc []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	require.NoError(t, dec.Decode(&v), "%q", doc)
	require.False(t, dec.More(), "%q holds more than one value", doc)
	return exact(t, v)
}

func exact(t *testing.T, v any) any {
	switch v := v.(type) {
	case json.Number:
		r, ok := new(big.Rat).SetString(string(v))
		require.True(t, ok, "number %q", v)
		return r.RatString()
	case []any:
		for i := range v {
			v[i] = exact(t, v[i])
		}
	case map[string]any:
		for k := range v {
			v[k] = exact(t, v[k])
		}
	}
	return v
}

// requireRespells checks that in is respelled into other bytes with the
// same meaning, and returns the variant.
func requireRespells(t *testing.T, in string) []byte {
	t.Helper()
	doc, err := jsontest.Read([]byte(in), 512)
	require.NoError(t, err, "%q", in)
	variant, ok := doc.Respell()
	require.True(t, ok, "%q", in)
	require.NotEqual(t, in, string(variant))
	require.True(t, json.Valid(variant), "%q respelled as %q", in, variant)
	require.Equal(t, decode(t, []byte(in)), decode(t, variant), "%q respelled as %q", in, variant)
	return variant
}

func TestRespellKeepsMeaning(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"b":1,"a":[1,2.5,{"d":null,"c":true}],"":"x"}`,
		`[]`, `{}`, `[[],{},[{}]]`,
		`0`, `-1.5e-7`, `1E400`, `123456789012345678901234567890`,
		`null`, `true`, `false`,
		`"<&>\u2028 \" \\ \n é 😀 \ud83d\ude00"`,
		`{"\u0061":"a","B":{"x":[null,{"y":-0}]}}`,
	} {
		requireRespells(t, in)
	}
}

func TestRespellSpellsOtherwise(t *testing.T) {
	t.Parallel()
	variant := requireRespells(t, `{"a":1,"b":"<x>","c":[2e3,4]}`)
	for _, want := range []string{"1E+00", "2e3", "4E+00", `\u003cx\u003e`, "\r\n", "\t"} {
		require.Contains(t, string(variant), want, "%q", variant)
	}
	doc, err := jsontest.Read(variant, 512)
	require.NoError(t, err)
	var keys []string
	for _, m := range doc.Value.([]jsontest.Member) {
		keys = append(keys, m.Key)
	}
	require.Equal(t, []string{"c", "b", "a"}, keys, "members in reverse order")
}

func TestReadKeepsOrderAndSpelling(t *testing.T) {
	t.Parallel()
	doc, err := jsontest.Read([]byte(` {"z": [1.0, "s", null, true], "a": {}} `), 512)
	require.NoError(t, err)
	require.Equal(t, []jsontest.Member{
		{"z", []any{json.Number("1.0"), "s", nil, true}},
		{"a", []jsontest.Member{}},
	}, doc.Value)
	require.False(t, doc.DuplicateKey)
	require.False(t, doc.Replacement)
	require.False(t, doc.BigExponent)
}

func TestReadRefuses(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"", " ", `{`, `[1,]`, `{"a":1}x`, `1 2`, `'a'`, "\"\xff\"", "{\"\xc3\":1}"} {
		_, err := jsontest.Read([]byte(in), 512)
		require.ErrorIs(t, err, jsontest.ErrInvalid, "%q", in)
	}
}

func TestReadDepth(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in    string
		depth int
	}{{`1`, 0}, {`"[[["`, 0}, {`[]`, 1}, {`{"a":[1]}`, 2}, {`[[{"a":[]}],[]]`, 4}} {
		_, err := jsontest.Read([]byte(tc.in), tc.depth)
		require.NoError(t, err, "%q at most %d deep", tc.in, tc.depth)
		if tc.depth == 0 {
			continue
		}
		_, err = jsontest.Read([]byte(tc.in), tc.depth-1)
		require.ErrorIs(t, err, jsontest.ErrTooDeep, "%q at most %d deep", tc.in, tc.depth-1)
	}
	deep := strings.Repeat("[", 600) + strings.Repeat("]", 600)
	_, err := jsontest.Read([]byte(deep), 512)
	require.ErrorIs(t, err, jsontest.ErrTooDeep)
}

// TestUnclearMeaningIsNotRespelled checks that a key twice in one object
// and U+FFFD in a string, whose meaning a respelling may change, are
// reported and not respelled.
func TestUnclearMeaningIsNotRespelled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in            string
		dup, replaced bool
	}{
		{in: `{"a":1,"a":2}`, dup: true},
		{in: `{"a":1,"\u0061":2}`, dup: true},
		{in: `[{"x":{"a":1,"b":2,"a":3}}]`, dup: true},
		{in: `{"a":{"a":1},"b":{"a":2}}`},
		{in: `{"a":1,"A":2}`},
		{in: `"\ud800"`, replaced: true},
		{in: `["a\udc00b"]`, replaced: true},
		{in: `{"\ud800":1,"\udc00":2}`, dup: true, replaced: true},
		{in: `"\ufffd"`, replaced: true},
		{in: "\"\uFFFD\"", replaced: true},
		{in: `"\ud83d\ude00"`},
		{in: `{"k":"plain"}`},
	} {
		doc, err := jsontest.Read([]byte(tc.in), 512)
		require.NoError(t, err, "%q", tc.in)
		require.Equal(t, tc.dup, doc.DuplicateKey, "duplicate key in %q", tc.in)
		require.Equal(t, tc.replaced, doc.Replacement, "U+FFFD in %q", tc.in)
		_, ok := doc.Respell()
		require.Equal(t, !tc.dup && !tc.replaced, ok, "%q", tc.in)
	}
}

func TestBigExponent(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{
		`1e99999999`:           false,
		`1e100000000`:          true,
		`[0, -2.5E-123456789]`: true,
		`1e+000000000001`:      false,
		`123456789012345`:      false,
	} {
		doc, err := jsontest.Read([]byte(in), 512)
		require.NoError(t, err, "%q", in)
		require.Equal(t, want, doc.BigExponent, "%q", in)
	}
}

// longExponent finds an exponent of 10^1000 or more.
var longExponent = regexp.MustCompile(`[eE][+-]?0*[1-9][0-9]{3}`)

// FuzzRespell checks that whatever Read takes and Respell respells means
// the same once respelled, and respells again.
func FuzzRespell(f *testing.F) {
	for _, seed := range []string{`{"b":[1,{"c":null}],"a":"<\u00e9>"}`, `[1e5,-0.0,"\t"]`, `"x"`, `{"a":1,"a":2}`, `"\ud800"`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		doc, err := jsontest.Read(in, 64)
		if err != nil {
			return
		}
		variant, ok := doc.Respell()
		if !ok || longExponent.Match(in) {
			return // a huge exponent is slow to make exact
		}
		require.NotEqual(t, string(in), string(variant))
		require.Equal(t, decode(t, in), decode(t, variant), "%q respelled as %q", in, variant)
		again, err := jsontest.Read(variant, 64)
		require.NoError(t, err, "%q respelled as %q", in, variant)
		_, ok = again.Respell()
		require.True(t, ok, "%q respelled as %q", in, variant)
	})
}

func ExampleDoc_Respell() {
	doc, err := jsontest.Read([]byte(`{"qty":2,"sku":"a&b"}`), 8)
	if err != nil {
		panic(err)
	}
	variant, ok := doc.Respell()
	fmt.Printf("%t %q\n", ok, variant)
	// Output: true " \r\n{\n \"sku\" :\t\"a\\u0026b\",\n \"qty\" :\t2E+00\n}\t"
}
