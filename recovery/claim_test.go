package recovery_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/recovery"
)

// The eight cells of the state machine: four key states, each with the same
// and with a different fingerprint.

func TestClaimAbsentSameFingerprint(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{"amount":100}`)

	rec, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeNew, outcome)
	require.Equal(t, recovery.StatusInFlight, rec.Status)
	require.Equal(t, key, rec.Key)
	require.Equal(t, "checkout", rec.Workflow)
	require.Equal(t, p.Fingerprint, rec.Fingerprint)
	require.JSONEq(t, `{"amount":100}`, string(rec.Request))
	require.NotEqual(t, uuid.Nil, rec.Owner)
	require.NotEqual(t, uuid.Nil, rec.ID)
	require.Empty(t, rec.RecoveryPoint)
	require.Zero(t, rec.Attempts)
	require.Nil(t, rec.Response)
	// The lease is measured on the database clock from the moment of the claim.
	within(t, recovery.LeaseDefault, rec.LockedUntil.Sub(rec.CreatedAt), time.Second)
	require.Equal(t, 1, b.count(t))
}

func TestClaimAbsentDifferentFingerprint(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	// The key once held a different request, rejected before it started and
	// deleted; the same key under another tenant holds yet another one.
	first, _ := b.claim(t, params(t, key, `{"amount":1}`))
	require.NoError(t, b.store.DeleteUnstarted(b.ctx, first.Fence()))
	b.claim(t, params(t, recovery.Key{Tenant: "other", ID: "k1"}, `{"amount":2}`))

	rec, outcome := b.claim(t, params(t, key, `{"amount":100}`))
	require.Equal(t, recovery.OutcomeNew, outcome, "an absent key has no fingerprint to differ from")
	require.NotEqual(t, first.ID, rec.ID, "a new record gets a new id")
	require.NotEqual(t, first.Owner, rec.Owner)
}

func TestClaimInFlightValidSameFingerprint(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{"amount":100}`)
	b.claim(t, p)
	before := b.load(t, key)

	_, _, err := b.store.Claim(b.ctx, p)
	require.ErrorIs(t, err, recovery.ErrInFlight)
	var inFlight *recovery.InFlightError
	require.True(t, errors.As(err, &inFlight))
	require.Equal(t, key, inFlight.Key)
	within(t, recovery.LeaseDefault, inFlight.RetryAfter, 2*time.Second)
	require.Equal(t, before, b.load(t, key), "a conflicting claim changes nothing")
}

func TestClaimInFlightValidDifferentFingerprint(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	b.claim(t, params(t, key, `{"amount":100}`))
	before := b.load(t, key)

	_, _, err := b.store.Claim(b.ctx, params(t, key, `{"amount":999}`))
	require.ErrorIs(t, err, recovery.ErrMismatch)
	require.NotErrorIs(t, err, recovery.ErrInFlight)
	require.Equal(t, before, b.load(t, key))
}

func TestClaimInFlightExpiredSameFingerprint(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{"amount":100}`)
	first, _ := b.claim(t, p)
	require.NoError(t, b.store.Advance(b.ctx, first.Fence(), "create_order", []byte(`{"order_id":42}`)))
	b.expire(t, key)

	rec, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeTakeover, outcome)
	require.NotEqual(t, first.Owner, rec.Owner, "a takeover mints a new owner token")
	require.Equal(t, first.ID, rec.ID, "the record keeps its id")
	require.Equal(t, "create_order", rec.RecoveryPoint, "the takeover resumes from the recovery point")
	require.JSONEq(t, `{"order_id":42}`, string(rec.State))
	require.Equal(t, 1, rec.Attempts, "the stopped attempt is counted")
	require.Contains(t, rec.LastError, "lease expired")
	require.Greater(t, time.Until(rec.LockedUntil), recovery.LeaseDefault-5*time.Second, "the takeover holds a fresh lease")
}

func TestClaimInFlightExpiredDifferentFingerprint(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	b.claim(t, params(t, key, `{"amount":100}`))
	b.expire(t, key)
	before := b.load(t, key)

	_, _, err := b.store.Claim(b.ctx, params(t, key, `{"amount":999}`))
	require.ErrorIs(t, err, recovery.ErrMismatch, "a different request never takes a key over")
	require.Equal(t, before, b.load(t, key))
}

func TestClaimCompletedSameFingerprint(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{"amount":100}`)
	rec, _ := b.claim(t, p)
	require.NoError(t, b.store.Complete(b.ctx, rec.Fence(), jsonResponse))
	version := b.rowVersion(t, key)

	replay, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeReplay, outcome)
	require.Equal(t, recovery.StatusCompleted, replay.Status)
	require.Equal(t, jsonResponse.Status, replay.Response.Status)
	require.Equal(t, jsonResponse.Body, replay.Response.Body)
	require.Equal(t, "application/json", replay.Response.Header.Get("Content-Type"))
	require.Equal(t, version, b.rowVersion(t, key), "a replay writes nothing")
}

func TestClaimCompletedDifferentFingerprint(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	rec, _ := b.claim(t, params(t, key, `{"amount":100}`))
	require.NoError(t, b.store.Complete(b.ctx, rec.Fence(), jsonResponse))

	got, _, err := b.store.Claim(b.ctx, params(t, key, `{"amount":999}`))
	require.ErrorIs(t, err, recovery.ErrMismatch)
	require.Nil(t, got, "a mismatched request sees nothing of the stored response")
}

// Beyond the eight cells: a terminal failure replays like a completion, and
// a released lease can be taken over at once.

func TestClaimFailedReplaysStoredError(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{"amount":100}`)
	rec, _ := b.claim(t, p)
	failure := recovery.Response{Status: 500, Body: []byte(`{"error":"gave up"}`)}
	require.NoError(t, b.store.Fail(b.ctx, rec.Fence(), failure, "too many attempts"))

	replay, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeReplay, outcome)
	require.Equal(t, recovery.StatusFailed, replay.Status)
	require.Equal(t, 500, replay.Response.Status)
	require.Equal(t, failure.Body, replay.Response.Body)
	require.Equal(t, "too many attempts", replay.LastError)
}

func TestClaimAfterReleaseTakesOverAtOnce(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{"amount":100}`)
	first, _ := b.claim(t, p)
	require.NoError(t, b.store.Release(b.ctx, first.Fence(), "provider timeout"))
	released := b.load(t, key)
	require.True(t, released.Released)
	require.Equal(t, 1, released.Attempts)

	rec, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeTakeover, outcome, "no need to wait out the old lease")
	require.Equal(t, 1, rec.Attempts, "a released attempt is counted once")
	require.Equal(t, "provider timeout", rec.LastError)
	require.False(t, rec.Released)
}

// TestConcurrentClaimsOneWinner races 64 claims of one key, 100 times: each
// time exactly one claim wins and every other sees the key in flight.
func TestConcurrentClaimsOneWinner(t *testing.T) {
	t.Parallel()
	const claimers, rounds = 64, 100
	b := setupWith(t, dbtest.NewPool(t, claimers))

	for round := range rounds {
		p := params(t, recovery.Key{Tenant: "acme", ID: fmt.Sprintf("race-%d", round)}, `{"amount":100}`)
		outcomes := raceClaims(b, p, claimers)
		require.Equal(t, 1, outcomes["new"], "round %d: %v", round, outcomes)
		require.Equal(t, claimers-1, outcomes["in flight"], "round %d: %v", round, outcomes)
	}
	require.Equal(t, rounds, b.count(t))
}

// TestConcurrentTakeoversOneWinner races 64 claims of one expired lease:
// exactly one takes it over.
func TestConcurrentTakeoversOneWinner(t *testing.T) {
	t.Parallel()
	const claimers, rounds = 64, 20
	b := setupWith(t, dbtest.NewPool(t, claimers))

	for round := range rounds {
		key := recovery.Key{Tenant: "acme", ID: fmt.Sprintf("takeover-%d", round)}
		p := params(t, key, `{"amount":100}`)
		b.claim(t, p)
		b.expire(t, key)
		outcomes := raceClaims(b, p, claimers)
		require.Equal(t, 1, outcomes["takeover"], "round %d: %v", round, outcomes)
		require.Equal(t, claimers-1, outcomes["in flight"], "round %d: %v", round, outcomes)
	}
}

// raceClaims starts n claims of p at once and counts their outcomes.
func raceClaims(b *bundle, p recovery.ClaimParams, n int) map[string]int {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		start    = make(chan struct{})
		outcomes = map[string]int{}
	)
	for range n {
		wg.Go(func() {
			<-start
			_, outcome, err := b.store.Claim(b.ctx, p)
			name := outcome.String()
			switch {
			case errors.Is(err, recovery.ErrInFlight):
				name = "in flight"
			case err != nil:
				name = "error: " + err.Error()
			}
			mu.Lock()
			outcomes[name]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	return outcomes
}

func TestTenantsAreIsolated(t *testing.T) {
	b := setup(t)
	acme := recovery.Key{Tenant: "acme", ID: "shared-key"}
	globex := recovery.Key{Tenant: "globex", ID: "shared-key"}

	acmeRec, outcome := b.claim(t, params(t, acme, `{"amount":100}`))
	require.Equal(t, recovery.OutcomeNew, outcome)
	globexRec, outcome := b.claim(t, params(t, globex, `{"amount":555}`))
	require.Equal(t, recovery.OutcomeNew, outcome, "the same key under another tenant is another record")
	require.NotEqual(t, acmeRec.ID, globexRec.ID)

	require.NoError(t, b.store.Complete(b.ctx, acmeRec.Fence(), recovery.Response{Status: 201, Body: []byte(`"acme's"`)}))
	// globex is still in flight: acme's completion did not touch it.
	require.Equal(t, recovery.StatusInFlight, b.load(t, globex).Status)
	require.NoError(t, b.store.Complete(b.ctx, globexRec.Fence(), recovery.Response{Status: 201, Body: []byte(`"globex's"`)}))

	replay, _ := b.claim(t, params(t, acme, `{"amount":100}`))
	require.Equal(t, `"acme's"`, string(replay.Response.Body))
	replay, _ = b.claim(t, params(t, globex, `{"amount":555}`))
	require.Equal(t, `"globex's"`, string(replay.Response.Body))

	// One tenant's request under the other tenant's key is a mismatch there,
	// never a replay of the other tenant's response.
	_, _, err := b.store.Claim(b.ctx, params(t, globex, `{"amount":100}`))
	require.ErrorIs(t, err, recovery.ErrMismatch)

	// One tenant's owner token cannot write the other tenant's record under
	// the same key.
	acmeReclaimed, _ := b.claim(t, params(t, recovery.Key{Tenant: "acme", ID: "second"}, `{}`))
	globexSecond, _ := b.claim(t, params(t, recovery.Key{Tenant: "globex", ID: "second"}, `{}`))
	before := b.load(t, globexSecond.Key)
	crossed := recovery.Fence{Key: globexSecond.Key, Owner: acmeReclaimed.Owner}
	require.ErrorIs(t, b.store.Advance(b.ctx, crossed, "x", nil), recovery.ErrLeaseLost)
	require.ErrorIs(t, b.store.Complete(b.ctx, crossed, jsonResponse), recovery.ErrLeaseLost)
	require.Equal(t, before, b.load(t, globexSecond.Key))
	_, err = b.store.Load(b.ctx, recovery.Key{Tenant: "initech", ID: "shared-key"})
	require.ErrorIs(t, err, recovery.ErrNotFound)
}

func TestReplayIsByteForByte(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{}`)
	rec, _ := b.claim(t, p)
	// Key order, whitespace, escapes and a trailing newline a jsonb column
	// would all have normalised away.
	body := []byte("{\"z\": 1,   \"a\" :[ 2,1 ],\n \"u\":\"\\u00e9\", \"n\": 1.50}\n")
	// Header values are bytes: a Latin-1 filename, or a NUL, which a JSON
	// string in jsonb cannot carry, come back as they were sent.
	disposition := []string{"attachment; filename=\"caf\xe9.pdf\"", "inline; filename=\"\u00e9t\u00e9.txt\"", "a\x00b"}
	header := map[string][]string{
		"Content-Type":        {"application/json; charset=utf-8"},
		"Link":                {"</a>; rel=a", "</b>; rel=b"},
		"Content-Disposition": disposition,
		"Set-Cookie":          {"session=secret"},
		"content-type":        {"text/plain"}, // another spelling of an allowed header: kept too
		"X-Request-Id":        {"abc"},
	}
	require.NoError(t, b.store.Complete(b.ctx, rec.Fence(), recovery.Response{Status: 201, Header: header, Body: body}))

	replay, _ := b.claim(t, p)
	require.Equal(t, body, replay.Response.Body)
	require.Equal(t, map[string][]string{
		"Content-Type":        replay.Response.Header["Content-Type"],
		"Link":                {"</a>; rel=a", "</b>; rel=b"},
		"Content-Disposition": disposition,
	}, map[string][]string(replay.Response.Header), "only allow-listed headers are kept, values in order and byte for byte")
	require.ElementsMatch(t, []string{"application/json; charset=utf-8", "text/plain"}, replay.Response.Header["Content-Type"])
	require.Equal(t, disposition, b.load(t, key).Response.Header["Content-Disposition"])

	// Bodies that are not JSON, or not text, are kept exactly too.
	binKey := recovery.Key{Tenant: "acme", ID: "binary"}
	binRec, _ := b.claim(t, params(t, binKey, `{}`))
	binary := []byte{0x00, 0xff, 0xfe, '\n', 0x80}
	require.NoError(t, b.store.Complete(b.ctx, binRec.Fence(), recovery.Response{Status: 200, Body: binary}))
	require.Equal(t, binary, b.load(t, binKey).Response.Body)
}

// TestFinishedForIsMeasuredOnTheDatabaseClock: the FinishedFor of a
// replay and of a load is how long ago the record finished by the
// database's clock alone. On a database an hour ahead of this process, a
// record that finished an hour ago by the database's clock has been
// finished an hour, which this process's clock set against CompletedAt
// (a reading of the database's) would call no time at all.
func TestFinishedForIsMeasuredOnTheDatabaseClock(t *testing.T) {
	t.Parallel()
	b := setupWith(t, dbtest.Connect(t, dbtest.NewSkewedDatabase(t, time.Hour, dbtest.Options{}), 4))
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{}`)
	rec, _ := b.claim(t, p)
	require.Zero(t, rec.FinishedFor, "in flight")
	before := time.Now()
	require.NoError(t, b.store.Complete(b.ctx, rec.Fence(), jsonResponse))
	_, err := b.db.Exec(b.ctx, `UPDATE onceflow_keys SET completed_at = completed_at - interval '1 hour'`)
	require.NoError(t, err)

	replay, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeReplay, outcome)
	loaded := b.load(t, key)
	took := time.Since(before)
	for name, r := range map[string]*recovery.Record{"replay": replay, "load": loaded} {
		require.GreaterOrEqual(t, r.FinishedFor, time.Hour, name)
		require.LessOrEqual(t, r.FinishedFor, time.Hour+took, name)
	}
}

// TestStoredHeaderEncoding: a header value in valid UTF-8 is stored as a
// JSON string, as every record stored before the base64 form was, and is
// read by SQL as text; only a value that a JSON string cannot hold takes
// the base64 form. A record stored before it replays as it was stored.
func TestStoredHeaderEncoding(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{}`)
	rec, _ := b.claim(t, p)
	require.NoError(t, b.store.Complete(b.ctx, rec.Fence(), recovery.Response{Status: 200, Header: http.Header{
		"Content-Type": {"text/plain; charset=utf-8"}, "Content-Disposition": {"attachment; filename=\"caf\xe9.pdf\""},
	}}))
	var stored string
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT response_header::text FROM onceflow_keys`).Scan(&stored))
	require.JSONEq(t, `{"Content-Type": ["text/plain; charset=utf-8"],
		"Content-Disposition": [{"base64": "YXR0YWNobWVudDsgZmlsZW5hbWU9ImNhZukucGRmIg=="}]}`, stored)

	// As a record stored before the base64 form holds it.
	before := http.Header{"Content-Type": {"application/json"}, "Link": {"</a>; rel=a", "</b>; rel=b"}, "Vary": nil}
	old, err := json.Marshal(before)
	require.NoError(t, err)
	_, err = b.db.Exec(b.ctx, `UPDATE onceflow_keys SET response_header = $1::jsonb`, old)
	require.NoError(t, err)
	replay, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeReplay, outcome)
	require.Equal(t, before, replay.Response.Header)
}

func TestResponseHeaderAllowListIsConfigurable(t *testing.T) {
	b := setup(t)
	store, err := recovery.New(b.db, recovery.Config{ResponseHeaders: []string{"x-request-id"}})
	require.NoError(t, err)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	rec, _, err := store.Claim(b.ctx, params(t, key, `{}`))
	require.NoError(t, err)
	require.NoError(t, store.Complete(b.ctx, rec.Fence(), recovery.Response{Status: 200, Header: map[string][]string{
		"Content-Type": {"text/plain"}, "X-Request-Id": {"abc"},
	}}))
	got := b.load(t, key).Response
	require.Equal(t, map[string][]string{"X-Request-Id": {"abc"}}, map[string][]string(got.Header))
	require.Equal(t, []byte{}, got.Body, "a nil body is stored as an empty one")
}

func TestInputRules(t *testing.T) {
	b := setup(t)
	cases := []struct {
		name  string
		key   recovery.Key
		field string
	}{
		{"missing tenant", recovery.Key{ID: "k"}, "tenant"},
		{"missing key", recovery.Key{Tenant: "t"}, "key"},
		{"long tenant", recovery.Key{Tenant: strings.Repeat("t", 256), ID: "k"}, "tenant"},
		{"long key", recovery.Key{Tenant: "t", ID: strings.Repeat("k", 256)}, "key"},
		{"multibyte key over 255 bytes", recovery.Key{Tenant: "t", ID: strings.Repeat("é", 128)}, "key"},
		{"control character", recovery.Key{Tenant: "t", ID: "a\nb"}, "key"},
		{"NUL byte", recovery.Key{Tenant: "t\x00", ID: "k"}, "tenant"},
		{"invalid UTF-8", recovery.Key{Tenant: "t", ID: "\xff"}, "key"},
		{"zero-width format character", recovery.Key{Tenant: "t", ID: "a\u200bb"}, "key"},
	}
	for _, tc := range cases {
		p := params(t, tc.key, `{}`)
		_, _, err := b.store.Claim(b.ctx, p)
		require.ErrorIs(t, err, recovery.ErrInvalidInput, tc.name)
		var inputErr *recovery.InputError
		require.True(t, errors.As(err, &inputErr), tc.name)
		require.Equal(t, tc.field, inputErr.Field, tc.name)
		_, err = b.store.Load(b.ctx, tc.key)
		require.ErrorIs(t, err, recovery.ErrInvalidInput, tc.name)
	}

	ok := recovery.Key{Tenant: strings.Repeat("t", 255), ID: strings.Repeat("é", 127) + "k"}
	require.NoError(t, ok.Validate(), "255 bytes, printable, is the limit")

	p := params(t, recovery.Key{Tenant: "t", ID: "k"}, `{}`)
	p.Workflow = ""
	_, _, err := b.store.Claim(b.ctx, p)
	require.ErrorIs(t, err, recovery.ErrInvalidInput)
	p = params(t, recovery.Key{Tenant: "t", ID: "k"}, `{}`)
	p.Lease = time.Microsecond
	_, _, err = b.store.Claim(b.ctx, p)
	require.ErrorIs(t, err, recovery.ErrInvalidInput)
	for _, request := range []string{"not json", `{"a":"\xff"}`, "{\"a\":\"\xff\"}", "{\"a\":\"\x00\"}", `{"a":1`} {
		p = params(t, recovery.Key{Tenant: "t", ID: "k"}, `{}`)
		p.Request = []byte(request)
		_, _, err = b.store.Claim(b.ctx, p)
		var inputErr *recovery.InputError
		require.ErrorAs(t, err, &inputErr, "request %q", request)
		require.Equal(t, "request", inputErr.Field, "request %q", request)
	}

	require.Zero(t, b.count(t), "nothing is written for rejected input")
}

func TestClaimUnderAnotherWorkflowIsMismatch(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	refund := recovery.ClaimParams{Key: key, Workflow: "refund", Fingerprint: recovery.FingerprintBytes("x", nil)}
	checkout := refund
	checkout.Workflow = "checkout"
	b.claim(t, refund)

	_, _, err := b.store.Claim(b.ctx, checkout)
	require.ErrorIs(t, err, recovery.ErrMismatch, "in flight")
	b.expire(t, key)
	_, _, err = b.store.Claim(b.ctx, checkout)
	require.ErrorIs(t, err, recovery.ErrMismatch, "an expired lease is not taken over for another workflow")
	require.Equal(t, "refund", b.load(t, key).Workflow)
}

// TestAnyValidJSONRequestIsStored: requests that jsonb would refuse (a NUL
// escape, numbers beyond numeric's range, lone surrogates) are valid JSON
// and are stored as written.
func TestAnyValidJSONRequestIsStored(t *testing.T) {
	b := setup(t)
	for i, body := range []string{`{"note":"a\u0000b"}`, `{"n":1e999999}`, `{"n":1e-20000}`, `"\ud800"`} {
		key := recovery.Key{Tenant: "acme", ID: fmt.Sprintf("k%d", i)}
		p := params(t, key, body)
		rec, outcome := b.claim(t, p)
		require.Equal(t, recovery.OutcomeNew, outcome, body)
		require.Equal(t, string(p.Request), string(rec.Request), body)
		require.NoError(t, b.store.Advance(b.ctx, rec.Fence(), "step", p.Request), body)
		require.Equal(t, string(p.Request), string(b.load(t, key).State), body)
	}
}

// TestClaimByAnotherPrincipalIsForbidden: a record answers only the
// principal that made it. Any other gets ErrForbidden whatever the record's
// state and whatever request it sends, so the error tells it nothing; an
// expired lease is not taken over for it.
func TestClaimByAnotherPrincipalIsForbidden(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	alice := params(t, key, `{"amount": 100}`)
	alice.Principal = "alice"
	rec, _ := b.claim(t, alice)

	others := func(state string) {
		t.Helper()
		for _, principal := range []string{"bob", ""} {
			for _, request := range []string{`{"amount": 100}`, `{"amount": 5}`} {
				p := params(t, key, request)
				p.Principal = principal
				_, _, err := b.store.Claim(b.ctx, p)
				require.ErrorIs(t, err, recovery.ErrForbidden, "%s: principal %q, request %s", state, principal, request)
				require.NotContains(t, err.Error(), "in flight", state)
			}
		}
	}
	others("in flight")
	b.expire(t, key)
	others("expired")
	require.Equal(t, rec.Owner, b.load(t, key).Owner, "no other principal took the expired lease over")

	rec, outcome := b.claim(t, alice)
	require.Equal(t, recovery.OutcomeTakeover, outcome, "the principal that made the record takes it over")
	require.NoError(t, b.store.Complete(b.ctx, rec.Fence(), jsonResponse))
	others("completed")
	_, outcome = b.claim(t, alice)
	require.Equal(t, recovery.OutcomeReplay, outcome)
}

// TestRecordWithoutPrincipalIsTheTenants: a record made before principals
// were stored (migration 0008) answers the tenant's default principal only.
func TestRecordWithoutPrincipalIsTheTenants(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{}`)
	rec, _ := b.claim(t, p)
	require.NoError(t, b.store.Complete(b.ctx, rec.Fence(), jsonResponse))
	_, err := b.db.Exec(b.ctx, `UPDATE onceflow_keys SET principal_hash = NULL`)
	require.NoError(t, err)

	_, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeReplay, outcome)
	p.Principal = "alice"
	_, _, err = b.store.Claim(b.ctx, p)
	require.ErrorIs(t, err, recovery.ErrForbidden)
}

// TestStoredRequestIsKeptByteForByte: the request column keeps what it is
// given, as a resume must decode it: an integer of 31 digits in full (not
// 1e+30, which a *big.Int does not read), member order and a repeated key.
// A jsonb column would normalise all three.
func TestStoredRequestIsKeptByteForByte(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	const request = `{"z": 1000000000000000000000000000000, "a": 1e30, "a": 2}`
	p := params(t, key, `{}`) // FingerprintJSON refuses a repeated key; Claim stores what it is given
	p.Request = []byte(request)
	b.claim(t, p)
	require.Equal(t, request, string(b.load(t, key).Request))
}
