package recovery_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/jsontest"
	"github.com/onceflow/onceflow/recovery"
)

// nameLimit is the documented longest tenant, key or workflow name, in
// bytes, restated here so that the rules below do not come from the code
// under test.
const nameLimit = 255

// FuzzClaimInput claims any tenant, key, workflow name and request against
// a real PostgreSQL, one database per fuzzing process, emptied before every
// input. It works out from the documented input rules alone whether the
// claim may be accepted, and checks:
//   - rejected: the error is an *InputError naming a field that breaks the
//     rules, Load of the key says the same or finds nothing, and no row is
//     stored;
//   - accepted: a new record holding the tenant, key, workflow and request
//     exactly as given, which Load returns byte for byte; the same request
//     again is in flight, a different request or workflow is a mismatch,
//     and the request written another way (JSON keys in another order,
//     other whitespace and escapes) is the same request;
//   - the request is fingerprinted as idemhttp does it: canonical JSON and
//     stored when FingerprintJSON takes it, byte for byte and not stored
//     otherwise; FingerprintJSON refuses only with a *JSONError.
//
// No input may panic or end in an error that is not one of these: a
// database error for bad input means the rules let it through. Run it
// longer with:
//
//	go test ./recovery -run '^$' -fuzz '^FuzzClaimInput$' -fuzztime 1m -fuzzminimizetime 500x
//
// Each run takes a few round trips, so minimizing a long input that found
// new coverage (by default for up to a minute, during which nothing else is
// fuzzed) costs more here than in a pure function's fuzz target:
// -fuzzminimizetime bounds it.
func FuzzClaimInput(f *testing.F) {
	require.Equal(f, nameLimit, recovery.MaxKeyLength)
	for _, s := range claimSeeds() {
		f.Add(s.tenant, s.key, s.workflow, []byte(s.request))
	}
	rig := newClaimRig(f)
	f.Fuzz(func(t *testing.T, tenant, key, workflow string, request []byte) {
		in := claimInput{tenant: tenant, key: key, workflow: workflow, request: request}
		rig.reset(t)
		in.check(t, rig)
	})
}

type claimSeed struct{ tenant, key, workflow, request string }

// claimSeeds are names at and around every input rule, and requests that
// are JSON, almost JSON, or far from it.
func claimSeeds() []claimSeed {
	const ok = `{"amount":100,"currency":"EUR"}`
	return []claimSeed{
		{"acme", "k1", "checkout", ok},
		{"acme", "k1", "checkout", ""},
		{"acme", "k1", "checkout", "not json"},
		{"", "k1", "checkout", ok},
		{"acme", "", "checkout", ok},
		{"acme", "k1", "", ok},
		{"", "", "", ""},
		{" ", " ", " ", ok}, // the ASCII space is printable
		{" acme ", "k 1", "POST /v1/charges", ok},
		{strings.Repeat("t", 255), strings.Repeat("k", 255), strings.Repeat("w", 255), ok},
		{strings.Repeat("t", 256), "k1", "checkout", ok},
		{"acme", strings.Repeat("k", 256), "checkout", ok},
		{"acme", "k1", strings.Repeat("w", 256), ok},
		{"acme", strings.Repeat("é", 127) + "k", "checkout", ok}, // 255 bytes
		{"acme", strings.Repeat("é", 128), "checkout", ok},       // 256 bytes, 128 runes
		{"acme", strings.Repeat("k", 254) + "é", "checkout", ok}, // the last rune crosses 255
		{"acme", strings.Repeat("k", 1<<20), "checkout", ok},
		{"ac\x00me", "k1", "checkout", ok},
		{"acme", "\x00", "checkout", ok},
		{"acme", "k1", "check\x00out", ok},
		{"\xff", "k1", "checkout", ok},
		{"acme", "k\xff1", "checkout", ok},
		{"acme", "k1", "\xc0\xaf", ok},               // an overlong '/'
		{"acme", "\xed\xa0\x80", "checkout", ok},     // a UTF-16 surrogate in UTF-8
		{"acme", "\xf4\x90\x80\x80", "checkout", ok}, // above U+10FFFF
		{"acme", "k\xe2\x82", "checkout", ok},        // a truncated rune
		{"acme", "k\t1", "checkout", ok},
		{"acme", "k1\n", "checkout", ok},
		{"acme", "k1", "check\r\nout", ok},
		{"acme", "k\x7f1", "checkout", ok},   // DEL
		{"acme", "k\u00801", "checkout", ok}, // a C1 control
		{"acme\u00a0", "k1", "checkout", ok}, // NBSP
		{"acme", "k\u200b1", "checkout", ok}, // zero-width space
		{"acme", "k\u3000", "checkout", ok},  // ideographic space
		{"acme", "k\u2028", "checkout", ok},  // line separator
		{"acme", "k\u00ad1", "checkout", ok}, // soft hyphen
		{"\ufeffacme", "k1", "checkout", ok}, // byte order mark
		{"acme", "k\ue000", "checkout", ok},  // private use
		{"acme", "k\u0378", "checkout", ok},  // unassigned
		{"acme", "k\U0010ffff", "checkout", ok},
		{"acme", "\ufffd", "checkout", ok}, // a real U+FFFD is valid and printable
		{"acme", "\u0301", "checkout", ok}, // a lone combining mark
		{"acme", "🙂", "checkout", ok},
		{"acme", "🇫🇷❤️", "checkout", ok},
		{"acme", "👩\u200d💻", "checkout", ok}, // the joiner is a format character
		{"société générale", "ключ-1", "注文", ok},
		{"acme", "k1", "checkout", `{"b":[1,2.50,-0,1e2],"a":{"z":null,"y":true},"c":"<&>\u00e9\/"}`},
		{"acme", "k1", "checkout", `{"note":"a\u0000b","n":1e999999}`},
		{"acme", "k1", "checkout", `["\ud800","\udc00\ud800","\ufffd"]`},
		{"acme", "k1", "checkout", `{"a":1,"a":2}`},
		{"acme", "k1", "checkout", "{\"a\":\"\xff\"}"},
		{"acme", "k1", "checkout", "{\"a\":\"\xed\xa0\x80\"}"},
		{"acme", "k1", "checkout", "{\"a\":\"\x00\"}"},
		{"acme", "k1", "checkout", "\x00"},
		{"acme", "k1", "checkout", "\xef\xbb\xbf{}"},
		{"acme", "k1", "checkout", `{"a":1} {}`},
		{"acme", "k1", "checkout", strings.Repeat("[", 512) + strings.Repeat("]", 512)},
		{"acme", "k1", "checkout", strings.Repeat("[", 513) + strings.Repeat("]", 513)},
		{"acme", "k1", "checkout", strings.Repeat("[", 10000)},
		{"acme", "k1", "checkout", strings.Repeat("[", 10000) + strings.Repeat("]", 10000)},
		{"acme", "k1", "checkout", `{"blob":"` + strings.Repeat("x", 1<<20) + `"}`},
		{"acme", "k1", "checkout", strings.Repeat("\xff", 1<<20)},
	}
}

// claimRig is the database of one fuzzing process.
type claimRig struct {
	*bundle
	// empty says the last input was checked to have stored nothing, so the
	// next needs no DELETE: minimizing an input runs it thousands of times,
	// mostly refused, and a round trip saved on each keeps fuzzing going.
	empty bool
}

func newClaimRig(f *testing.F) *claimRig {
	db := dbtest.NewPool(f, 2)
	store, err := recovery.New(db, recovery.Config{})
	require.NoError(f, err)
	return &claimRig{bundle: &bundle{ctx: context.Background(), db: db, store: store}}
}

// reset empties the keys table before an input.
func (rig *claimRig) reset(t *testing.T) {
	if rig.empty {
		rig.empty = false
		return
	}
	_, err := rig.db.Exec(rig.ctx, `DELETE FROM onceflow_keys`)
	require.NoError(t, err)
}

// claimInput is one fuzzed claim.
type claimInput struct {
	tenant, key, workflow string
	request               []byte
}

func (in claimInput) String() string {
	return fmt.Sprintf("tenant %.80q (%d bytes), key %.80q (%d bytes), workflow %.80q (%d bytes), %d-byte request %.80q",
		in.tenant, len(in.tenant), in.key, len(in.key), in.workflow, len(in.workflow), len(in.request), in.request)
}

// brokenFields names the fields that break the input rules.
func (in claimInput) brokenFields() []string {
	var broken []string
	for _, f := range []struct{ name, value string }{
		{"tenant", in.tenant}, {"key", in.key}, {"workflow", in.workflow},
	} {
		if !followsNameRules(f.value) {
			broken = append(broken, f.name)
		}
	}
	return broken
}

// followsNameRules restates the documented rules for a tenant, key or
// workflow name: required, at most 255 bytes, valid UTF-8, printable.
// Printable is Go's meaning: letters, marks, numbers, punctuation, symbols
// and the ASCII space; not other spaces, controls, format characters,
// private use or unassigned code points.
func followsNameRules(s string) bool {
	if s == "" || len(s) > nameLimit || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r != ' ' && !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S) {
			return false
		}
	}
	return true
}

// fingerprinted is a request as idemhttp fingerprints it: canonical JSON
// when FingerprintJSON takes it (and stored), its bytes otherwise (and not
// stored).
type fingerprinted struct {
	fp     recovery.Fingerprint
	stored []byte // the canonical JSON; nil when the request is not JSON
}

func fingerprint(t *testing.T, workflow string, request []byte) fingerprinted {
	fp, canonical, err := recovery.FingerprintJSON(workflow, request)
	if err != nil {
		var jsonErr *recovery.JSONError
		require.True(t, errors.As(err, &jsonErr), "FingerprintJSON(%.80q): %v", request, err)
		require.ErrorIs(t, err, recovery.ErrInvalidJSON)
		return fingerprinted{fp: recovery.FingerprintBytes(workflow, request)}
	}
	require.True(t, json.Valid(request) && utf8.Valid(request), "FingerprintJSON took what is not JSON: %.80q", request)
	require.True(t, json.Valid(canonical) && utf8.Valid(canonical), "canonical form %.80q", canonical)
	return fingerprinted{fp: fp, stored: canonical}
}

func (in claimInput) params(fp fingerprinted) recovery.ClaimParams {
	return recovery.ClaimParams{Key: recovery.Key{Tenant: in.tenant, ID: in.key}, Workflow: in.workflow,
		Fingerprint: fp.fp, Request: fp.stored}
}

func (in claimInput) check(t *testing.T, rig *claimRig) {
	req := fingerprint(t, in.workflow, in.request)
	p := in.params(req)
	rec, outcome, err := rig.store.Claim(rig.ctx, p)
	if broken := in.brokenFields(); len(broken) > 0 {
		in.checkRejected(t, rig, broken, err)
		return
	}
	require.NoError(t, err, in)
	require.Equal(t, recovery.OutcomeNew, outcome, in)
	requireHolds(t, p, rec, in)
	loaded := rig.load(t, p.Key)
	requireHolds(t, p, loaded, in)
	require.Equal(t, rec.ID, loaded.ID, in)
	require.Equal(t, rec.Owner, loaded.Owner, in)
	version := rig.rowVersion(t, p.Key)

	_, _, err = rig.store.Claim(rig.ctx, p)
	requireInFlight(t, p.Key, err, in)

	other := fingerprint(t, in.workflow, slices.Concat([]byte("["), in.request, []byte("]")))
	require.NotEqual(t, req.fp, other.fp, in)
	_, _, err = rig.store.Claim(rig.ctx, in.params(other))
	require.ErrorIs(t, err, recovery.ErrMismatch, "a different request: %v", in)
	require.NotErrorIs(t, err, recovery.ErrInFlight, in)

	elsewhere := in
	elsewhere.workflow = "other"
	if in.workflow == elsewhere.workflow {
		elsewhere.workflow = "another"
	}
	_, _, err = rig.store.Claim(rig.ctx, elsewhere.params(fingerprint(t, elsewhere.workflow, in.request)))
	require.ErrorIs(t, err, recovery.ErrMismatch, "another workflow: %v", in)

	if req.stored != nil {
		in.checkRespelled(t, rig, req)
	}
	require.Equal(t, version, rig.rowVersion(t, p.Key), "a refused claim wrote the record: %v", in)
	require.Equal(t, 1, rig.count(t), in)
}

// checkRejected checks a claim the rules refuse, naming one of broken.
func (in claimInput) checkRejected(t *testing.T, rig *claimRig, broken []string, err error) {
	require.ErrorIs(t, err, recovery.ErrInvalidInput, "broken %v: %v", broken, in)
	var inputErr *recovery.InputError
	require.True(t, errors.As(err, &inputErr), "not an *InputError: %v: %v", err, in)
	require.Contains(t, broken, inputErr.Field, in)
	require.NotEmpty(t, inputErr.Problem, in)

	_, err = rig.store.Load(rig.ctx, recovery.Key{Tenant: in.tenant, ID: in.key})
	if slices.Contains(broken, "tenant") || slices.Contains(broken, "key") {
		require.True(t, errors.As(err, &inputErr), "Load: %v: %v", err, in)
		require.Contains(t, []string{"tenant", "key"}, inputErr.Field, in)
		require.Contains(t, broken, inputErr.Field, in)
	} else {
		require.ErrorIs(t, err, recovery.ErrNotFound, in)
	}
	require.Zero(t, rig.count(t), "a refused claim stored a row: %v", in)
	rig.empty = true
}

// checkRespelled claims the JSON request written another way: the same
// request, so in flight, never a mismatch.
func (in claimInput) checkRespelled(t *testing.T, rig *claimRig, req fingerprinted) {
	doc, err := jsontest.Read(in.request, recovery.MaxJSONDepth)
	require.NoError(t, err, "encoding/json cannot read %.80q", in.request)
	variant, ok := doc.Respell()
	if !ok {
		return
	}
	again := fingerprint(t, in.workflow, variant)
	require.Equal(t, string(req.stored), string(again.stored), "%v respelled as %.200q", in, variant)
	require.Equal(t, req.fp, again.fp, "%v respelled as %.200q", in, variant)
	p := in.params(again)
	_, _, err = rig.store.Claim(rig.ctx, p)
	requireInFlight(t, p.Key, err, in)
}

// requireHolds checks that rec is p's new record, byte for byte.
func requireHolds(t *testing.T, p recovery.ClaimParams, rec *recovery.Record, in claimInput) {
	require.NotNil(t, rec, in)
	require.Equal(t, []byte(p.Key.Tenant), []byte(rec.Key.Tenant), in)
	require.Equal(t, []byte(p.Key.ID), []byte(rec.Key.ID), in)
	require.Equal(t, []byte(p.Workflow), []byte(rec.Workflow), in)
	require.Equal(t, p.Fingerprint, rec.Fingerprint, in)
	require.True(t, bytes.Equal(p.Request, rec.Request), "stored request %.80q: %v", rec.Request, in)
	require.Equal(t, p.Request == nil, rec.Request == nil, "nil stores no request: %v", in)
	require.Equal(t, recovery.StatusInFlight, rec.Status, in)
	require.Zero(t, rec.Attempts, in)
	require.Empty(t, rec.RecoveryPoint, in)
	require.Nil(t, rec.Response, in)
}

func requireInFlight(t *testing.T, key recovery.Key, err error, in claimInput) {
	require.ErrorIs(t, err, recovery.ErrInFlight, "the same request again: %v", in)
	require.NotErrorIs(t, err, recovery.ErrMismatch, in)
	var inFlight *recovery.InFlightError
	require.True(t, errors.As(err, &inFlight), in)
	require.Equal(t, key, inFlight.Key, in)
	require.Positive(t, inFlight.RetryAfter, in)
}
