package recovery_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/recovery"
)

const traceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestTraceParentIsStoredByTheClaimThatCreatesTheRecord(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{"amount": 100}`)
	p.TraceParent = traceParent
	rec, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeNew, outcome)
	require.Equal(t, traceParent, rec.TraceParent, "the claim returns it")
	require.Equal(t, traceParent, b.load(t, key).TraceParent, "and stores it")

	b.expire(t, key)
	p.TraceParent = "00-11111111111111111111111111111111-2222222222222222-01"
	rec, outcome = b.claim(t, p)
	require.Equal(t, recovery.OutcomeTakeover, outcome)
	require.Equal(t, traceParent, rec.TraceParent, "a takeover keeps the creating request's")

	none := recovery.Key{Tenant: "acme", ID: "k2"}
	rec, _ = b.claim(t, params(t, none, `{}`))
	require.Empty(t, rec.TraceParent)
}

func TestTraceParentInputRules(t *testing.T) {
	b := setup(t)
	for _, tp := range []string{
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", // upper case
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n",
		strings.Repeat("a", 256),
	} {
		key := recovery.Key{Tenant: "acme", ID: "k"}
		p := params(t, key, `{}`)
		p.TraceParent = tp
		_, _, err := b.store.Claim(b.ctx, p)
		var inputErr *recovery.InputError
		require.ErrorAs(t, err, &inputErr, "%q", tp)
		require.Equal(t, "trace parent", inputErr.Field)
	}
	require.Zero(t, b.count(t), "nothing was written")
}

func TestHistoryRecordsClaimsAndTakeovers(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{"amount": 100}`)
	first, _ := b.claim(t, p)
	require.Len(t, first.History, 1)
	claimed := first.History[0]
	require.Equal(t, recovery.TransitionClaimed, claimed.Kind)
	require.Equal(t, first.Owner, claimed.Owner)
	require.WithinDuration(t, first.CreatedAt, claimed.At, time.Second, "by the database clock")

	b.expire(t, key)
	second, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeTakeover, outcome)
	require.Len(t, second.History, 2)
	abandoned := second.History[1]
	require.Equal(t, recovery.TransitionTakenOver, abandoned.Kind)
	require.Equal(t, second.Owner, abandoned.Owner, "the taker's owner token")
	require.Contains(t, abandoned.Error, "lease expired", "a lease that ran out is named")
	require.False(t, abandoned.At.Before(claimed.At))

	require.NoError(t, b.store.Release(b.ctx, second.Fence(), "try again"))
	third, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeTakeover, outcome)
	last := third.History[len(third.History)-1]
	require.Equal(t, recovery.TransitionTakenOver, last.Kind)
	require.Equal(t, third.Owner, last.Owner)
	require.Empty(t, last.Error, "a released lease was not abandoned")

	require.Equal(t, third.History, b.load(t, key).History, "Load reads what the claim returned")
}

func TestHistoryKeepsTheLatestMaxHistory(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{}`)
	rec, _ := b.claim(t, p)
	takeovers := recovery.MaxHistory + 5
	for range takeovers {
		b.expire(t, key)
		rec, _ = b.claim(t, p)
	}
	require.Equal(t, recovery.MaxHistory, len(rec.History))
	require.Equal(t, takeovers+1-recovery.MaxHistory, rec.HistoryTruncated, "the claim and the oldest takeovers were dropped")
	require.Equal(t, rec.Owner, rec.History[recovery.MaxHistory-1].Owner, "newest last")
	for i, tr := range rec.History {
		require.Equal(t, recovery.TransitionTakenOver, tr.Kind, "entry %d", i)
		if i > 0 {
			require.False(t, tr.At.Before(rec.History[i-1].At), "entry %d is in order", i)
		}
	}
}

// A build from before migration 0014 calls the claim function of 0012's
// signature, which still creates a record: with no trace context and no
// history.
func TestClaimOfAnOlderBuildStillWorks(t *testing.T) {
	b := setup(t)
	var owner uuid.UUID
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT owner FROM onceflow_claim('acme', 'k1', gen_random_uuid(), 'checkout',
		'\x00', '{}', gen_random_uuid(), 30000000, 'abandoned', NULL, NULL, true)`).Scan(&owner))
	rec := b.load(t, recovery.Key{Tenant: "acme", ID: "k1"})
	require.Equal(t, owner, rec.Owner)
	require.Empty(t, rec.TraceParent)
	require.Empty(t, rec.History)
}
