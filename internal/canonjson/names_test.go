package canonjson_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/canonjson"
)

// TestNamesCollide: names collide where encoding/json reads them as one:
// equal but for case (by Unicode simple folding), or equal once decoded;
// at any depth; not across objects, and not names that only look alike.
func TestNamesCollide(t *testing.T) {
	t.Parallel()
	for doc, want := range map[string]bool{
		`{"amount":100,"AMOUNT":1}`:           true,
		`{"a":{"x":1},"b":[{"Id":1,"ID":2}]}`: true,
		`{"\u212a":1,"k":2}`:                  true, // the Kelvin sign folds to k
		`{"ſ":1,"S":2}`:                       true, // the long s folds to s
		`{"é":1,"\u00c9":2}`:                  true,
		`{"\ud800":1,"\udc00":2}`:             true, // both U+FFFD to encoding/json
		`{"\ud800":1,"\ufffd":2}`:             true,
		`{"a\"b":1,"A\"B":2}`:                 true,
		`{"amount":100,"currency":"usd"}`:     false,
		`{"a":{"k":1},"b":{"K":1}}`:           false, // another object
		`[{"k":1},{"K":1}]`:                   false,
		`{"a_b":1,"ab":2,"a-b":3}`:            false,
		`{"ss":1,"ß":2}`:                      false, // full folding only
		`{"\n":1,"N":2}`:                      false,
		`{"x":1}`:                             false,
		`"AMOUNT amount"`:                     false,
	} {
		got, err := canonjson.NamesCollide([]byte(doc))
		require.NoError(t, err, doc)
		require.Equal(t, want, got, doc)
		canonical, err := canonjson.Append(nil, []byte(doc))
		require.NoError(t, err, doc)
		got, err = canonjson.NamesCollide(canonical)
		require.NoError(t, err, doc)
		require.Equal(t, want, got, "canonical %s", canonical)
	}
	for _, bad := range []string{`{"a":1,"a":2}x`, `{"a":`, `{"a":1} {}`} {
		_, err := canonjson.NamesCollide([]byte(bad))
		require.ErrorIs(t, err, canonjson.ErrInvalid, bad)
	}
}

// TestCollidingNamesAreReadByOrder: where names collide, encoding/json
// reads a struct from the last of them, so the members' order, which the
// canonical form drops, decides the value.
func TestCollidingNamesAreReadByOrder(t *testing.T) {
	t.Parallel()
	var first, second struct {
		Amount int `json:"amount"`
	}
	require.NoError(t, json.Unmarshal([]byte(`{"amount":100,"AMOUNT":1}`), &first))
	require.NoError(t, json.Unmarshal([]byte(`{"AMOUNT":1,"amount":100}`), &second))
	require.NotEqual(t, first, second)
	a, err := canonjson.Append(nil, []byte(`{"amount":100,"AMOUNT":1}`))
	require.NoError(t, err)
	b, err := canonjson.Append(nil, []byte(`{"AMOUNT":1,"amount":100}`))
	require.NoError(t, err)
	require.Equal(t, a, b, "one canonical form")
}
