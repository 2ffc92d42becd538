package canonjson_test

import (
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/canonjson"
)

func canonical(t *testing.T, in string) string {
	t.Helper()
	out, err := canonjson.Append(nil, []byte(in))
	require.NoError(t, err, "input %q", in)
	return string(out)
}

func TestCanonicalizeForms(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		// structure and whitespace
		{` { "b" : 1 , "a" : [ 1 , 2 , { "d" : null , "c" : true } ] } `, `{"a":[1,2,{"c":true,"d":null}],"b":1}`},
		{"\t[\r\n]\n", `[]`},
		{`{}`, `{}`},
		{`"x"`, `"x"`},
		{`false`, `false`},
		// keys sort by their canonical bytes, whatever their escaping
		{`{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		{`{"aa":1,"a":2,"":3}`, `{"":3,"a":2,"aa":1}`},
		// numbers: one spelling per value, never rounded
		{`[1, 1.0, 1e0, 1E0, 10e-1, 0.1e1, 1.000e+0]`, `[1,1,1,1,1,1,1]`},
		{`[0, -0, 0.0, -0.0e5, 0e-7]`, `[0,0,0,0,0]`},
		{`[100, 1e2, 1E+2, 0.001e5]`, `[100,100,100,100]`},
		{`[1.50, -2.250, 12.34e-10]`, `[1.5,-2.25,1.234e-9]`},
		{`[1e21, 1e20, 123456789012345678901, 1234567890123456789012]`, `[1e+21,100000000000000000000,123456789012345678901,1.234567890123456789012e+21]`},
		{`[0.000001, 0.0000001, 1e-7, -1.5e-7]`, `[0.000001,1e-7,1e-7,-1.5e-7]`},
		{`[3.141592653589793238462643383279, 1e400, 1e-400]`, `[3.141592653589793238462643383279,1e+400,1e-400]`},
		{`[9007199254740993]`, `[9007199254740993]`},
		// strings: one escaping
		{`"\u0041\/\u00e9\u00E9é"`, `"A/ééé"`},
		{`"\"\\\b\f\n\r\t\u001f\u0000"`, `"\"\\\b\f\n\r\t\u001f\u0000"`},
		{`"\ud83d\ude00😀"`, `"😀😀"`},
		{`"\uD800 and \uDC00 alone"`, `"\ud800 and \udc00 alone"`},
		{`"\ud800\u0041"`, `"\ud800A"`},
		{`"<&>\u003c\u0026\u003e"`, `"<&><&>"`},
		{"\"\u2028\x7f\"", "\"\u2028\x7f\""},
	}
	for _, tc := range cases {
		got := canonical(t, tc.in)
		require.Equal(t, tc.want, got, "input %q", tc.in)
		require.Equal(t, got, canonical(t, got), "canonical form of %q is not a fixed point", tc.in)
	}
}

func TestCanonicalizeAppends(t *testing.T) {
	t.Parallel()
	out, err := canonjson.Append([]byte("prefix:"), []byte(`{"b":2,"a":1}`))
	require.NoError(t, err)
	require.Equal(t, `prefix:{"a":1,"b":2}`, string(out))
}

func TestCanonicalizeRejects(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"empty":                  ``,
		"only space":             `   `,
		"duplicate key":          `{"a":1,"a":2}`,
		"duplicate by escaping":  `{"a":1,"\u0061":2}`,
		"trailing comma":         `[1,]`,
		"missing colon":          `{"a" 1}`,
		"non-string key":         `{1:2}`,
		"leading zero":           `01`,
		"bare point":             `1.`,
		"leading point":          `.5`,
		"empty exponent":         `1e`,
		"plus sign":              `+1`,
		"bad escape":             `"\x"`,
		"short unicode":          `"\u12"`,
		"bad unicode":            `"\u12g4"`,
		"invalid utf-8":          "\"\xff\"",
		"raw control":            "\"a\nb\"",
		"trailing data":          `1 2`,
		"unterminated":           `{"a":[1`,
		"partial literal":        `tru`,
		"nan":                    `NaN`,
		"exponent too large":     `1e1000000000000000000`,
		"canonical out of range": `10e999999999`,
		"too deep":               strings.Repeat("[", canonjson.MaxDepth+1) + strings.Repeat("]", canonjson.MaxDepth+1),
	}
	for name, in := range cases {
		_, err := canonjson.Append(nil, []byte(in))
		require.ErrorIs(t, err, canonjson.ErrInvalid, name)
		var jsonErr *canonjson.Error
		require.True(t, errors.As(err, &jsonErr), name)
	}
	// The deepest nesting allowed is fine.
	deep := strings.Repeat("[", canonjson.MaxDepth) + strings.Repeat("]", canonjson.MaxDepth)
	require.Equal(t, deep, canonical(t, deep))
	// Near the exponent bound, the canonical form itself stays acceptable.
	require.Equal(t, "1e+999999998", canonical(t, "10e999999997"))
}

// TestCanonicalizeMatchesEncodingJSON checks that what Canonicalize accepts
// is JSON by the standard library's reading, and means the same value.
func TestCanonicalizeMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	in := `{"z":[1,2.5,"s",null,true,{"k":"v"}],"a":{"nested":{"deep":-1e-3}},"m":"\u00e9\n"}`
	out := canonical(t, in)
	var fromIn, fromOut any
	require.NoError(t, json.Unmarshal([]byte(in), &fromIn))
	require.NoError(t, json.Unmarshal([]byte(out), &fromOut))
	require.Equal(t, fromIn, fromOut)
}

func TestDuplicateKeyErrorPointsAtTheKey(t *testing.T) {
	t.Parallel()
	_, err := canonjson.Append(nil, []byte(`{"a":1,"a":2}`))
	var jsonErr *canonjson.Error
	require.True(t, errors.As(err, &jsonErr))
	require.Equal(t, 7, jsonErr.Offset)
	require.Contains(t, jsonErr.Problem, `duplicate object key "a"`)
}

// TestDeepNestingStaysLinear: a large value under the deepest nesting must
// not be copied once per level. Measured in bytes allocated, not time.
func TestDeepNestingStaysLinear(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	depth := canonjson.MaxDepth - 1
	doc := []byte(strings.Repeat(`{"k":`, depth) + `"` + big + `"` + strings.Repeat("}", depth))

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	out, err := canonjson.Append(nil, doc)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Equal(t, doc, out, "already canonical")
	allocated := after.TotalAlloc - before.TotalAlloc
	require.Less(t, allocated, uint64(8*len(doc)), "allocated %d bytes for a %d-byte document", allocated, len(doc))
}
