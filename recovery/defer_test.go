package recovery_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/recovery"
)

// inFlightFor requires err to be a deferral's ErrInFlight whose RetryAfter
// is the deferral after, less at most the time since start: the record was
// deferred after start, and the claim that answered ran before now, both
// on the database's clock, which is the machine's.
func inFlightFor(t *testing.T, err error, after time.Duration, start time.Time) {
	t.Helper()
	elapsed := time.Since(start)
	var inFlight *recovery.InFlightError
	require.ErrorAs(t, err, &inFlight)
	require.True(t, inFlight.Deferred, "%v", err)
	require.LessOrEqual(t, inFlight.RetryAfter, after)
	require.GreaterOrEqual(t, inFlight.RetryAfter, after-elapsed)
	require.ErrorContains(t, err, "deferred")
}

// TestHandBackForDefersTheKey: a deferred hand-back releases the lease
// counting an attempt, and keeps every claim and takeover out until
// its not-before time, answering ErrInFlight with the time left; a
// takeover after it clears the deferral. The old owner is fenced out.
func TestHandBackForDefersTheKey(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{}`)
	rec, _ := b.claim(t, p)
	const after = 90 * time.Second
	start := time.Now()
	notBefore, err := seam.StoreOf(b.store).HandBackFor(b.ctx, rec.Fence(), after, "provider said 429", true)
	require.NoError(t, err)

	got := b.load(t, key)
	require.True(t, got.Released)
	require.Equal(t, recovery.StatusInFlight, got.Status)
	require.True(t, notBefore.Equal(got.NotBefore), "%s, %s", notBefore, got.NotBefore)
	require.Equal(t, 1, got.Attempts, "a deferral counts an attempt")
	require.Equal(t, "provider said 429", got.LastError)
	_, err = seam.StoreOf(b.store).HandBackFor(b.ctx, rec.Fence(), after, "again", true)
	require.ErrorIs(t, err, recovery.ErrLeaseLost)

	version := b.rowVersion(t, key)
	_, _, err = b.store.Claim(b.ctx, p)
	inFlightFor(t, err, after, start)
	_, _, err = seam.StoreOf(b.store).Takeover(b.ctx, key, "checkout")
	inFlightFor(t, err, after, start)
	require.Equal(t, version, b.rowVersion(t, key), "a refused claim writes nothing")

	_, err = b.db.Exec(b.ctx, `UPDATE onceflow_keys SET not_before = clock_timestamp() - interval '1 millisecond'`)
	require.NoError(t, err)
	taken, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeTakeover, outcome)
	require.Zero(t, taken.NotBefore, "the takeover clears the deferral")
	require.Equal(t, 1, taken.Attempts, "a released lease is not counted again")
	require.Zero(t, b.load(t, key).NotBefore)
}

// TestHandBackForUncounted: a deferral that is not counted (a paced call
// that waited for its turn) defers the key like one that is, and leaves its
// attempts as they were.
func TestHandBackForUncounted(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{}`)
	rec, _ := b.claim(t, p)
	start := time.Now()
	_, err := seam.StoreOf(b.store).HandBackFor(b.ctx, rec.Fence(), time.Minute, "waits its turn", false)
	require.NoError(t, err)
	got := b.load(t, key)
	require.True(t, got.Released)
	require.Zero(t, got.Attempts, "a deferral for a turn spends no attempt")
	_, _, err = b.store.Claim(b.ctx, p)
	inFlightFor(t, err, time.Minute, start)
}

// TestHandBackForIsBounded: a deferral longer than MaxDefer is cut to it,
// and a negative one defers nothing: its not-before time is when it was
// written, not before.
func TestHandBackForIsBounded(t *testing.T) {
	b := setup(t)
	long := recovery.Key{Tenant: "acme", ID: "long"}
	rec, _ := b.claim(t, params(t, long, `{}`))
	start := time.Now()
	_, err := seam.StoreOf(b.store).HandBackFor(b.ctx, rec.Fence(), 30*24*time.Hour, "a month", true)
	require.NoError(t, err)
	_, _, err = b.store.Claim(b.ctx, params(t, long, `{}`))
	inFlightFor(t, err, recovery.MaxDefer, start)

	negative := recovery.Key{Tenant: "acme", ID: "negative"}
	rec, _ = b.claim(t, params(t, negative, `{}`))
	notBefore, err := seam.StoreOf(b.store).HandBackFor(b.ctx, rec.Fence(), -time.Hour, "in the past", true)
	require.NoError(t, err)
	require.False(t, notBefore.Before(rec.UpdatedAt), "not before %s, claimed at %s", notBefore, rec.UpdatedAt)
	_, outcome := b.claim(t, params(t, negative, `{}`))
	require.Equal(t, recovery.OutcomeTakeover, outcome)
}

// TestReleaseEndsADeferral: an operator's release of a deferred key (keys
// release) lets the next claim take it over at once.
func TestReleaseEndsADeferral(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	rec, _ := b.claim(t, params(t, key, `{}`))
	_, err := seam.StoreOf(b.store).HandBackFor(b.ctx, rec.Fence(), time.Hour, "provider said 429", true)
	require.NoError(t, err)
	deferred := b.load(t, key)
	require.NoError(t, seam.StoreOf(b.store).ReleaseLeaseOver(b.ctx, deferred.Fence(), "released by an operator"))
	require.Zero(t, b.load(t, key).NotBefore)
	_, outcome := b.claim(t, params(t, key, `{}`))
	require.Equal(t, recovery.OutcomeTakeover, outcome)
}
