package recovery_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/seam"
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
	require.Empty(t, first.History, "a claim does not read the history")
	history := b.load(t, key).History
	require.Len(t, history, 1)
	claimed := history[0]
	require.Equal(t, recovery.TransitionClaimed, claimed.Kind)
	require.Equal(t, first.Owner, claimed.Owner)
	require.WithinDuration(t, first.CreatedAt, claimed.At, time.Second, "by the database clock")

	b.expire(t, key)
	second, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeTakeover, outcome)
	require.Equal(t, []recovery.TransitionKind{recovery.TransitionClaimed, recovery.TransitionLeaseExpired, recovery.TransitionTakenOver},
		kinds(b.load(t, key).History))
	abandoned := b.load(t, key).History[2]
	require.Equal(t, recovery.TransitionTakenOver, abandoned.Kind)
	require.Equal(t, second.Owner, abandoned.Owner, "the taker's owner token")
	require.Contains(t, abandoned.Error, "lease expired", "a lease that ran out is named")
	require.False(t, abandoned.At.Before(claimed.At))

	require.NoError(t, b.store.Release(b.ctx, second.Fence(), "try again"))
	third, outcome := b.claim(t, p)
	require.Equal(t, recovery.OutcomeTakeover, outcome)
	history = b.load(t, key).History
	last := history[len(history)-1]
	require.Equal(t, recovery.TransitionTakenOver, last.Kind)
	require.Equal(t, third.Owner, last.Owner)
	require.Empty(t, last.Error, "a released lease was not abandoned")

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
	owner := rec.Owner
	rec = b.load(t, key)
	require.Equal(t, owner, rec.Owner)
	require.Equal(t, recovery.MaxHistory, len(rec.History))
	require.Equal(t, 1+2*takeovers-recovery.MaxHistory, rec.HistoryTruncated, "the claim and the oldest transitions were dropped")
	require.Equal(t, rec.Owner, rec.History[recovery.MaxHistory-1].Owner, "newest last")
	for i, tr := range rec.History {
		want := []recovery.TransitionKind{recovery.TransitionLeaseExpired, recovery.TransitionTakenOver}[i%2]
		require.Equal(t, want, tr.Kind, "entry %d", i)
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

// kinds lists the kinds of h.
func kinds(h []recovery.Transition) []recovery.TransitionKind {
	out := make([]recovery.TransitionKind, len(h))
	for i, tr := range h {
		out[i] = tr.Kind
	}
	return out
}

// last returns key's newest transition.
func (b *bundle) last(t *testing.T, key recovery.Key) recovery.Transition {
	t.Helper()
	h := b.load(t, key).History
	require.NotEmpty(t, h)
	return h[len(h)-1]
}

func TestHistoryRecordsEachTransitionOfAnAttempt(t *testing.T) {
	b := setup(t)
	engine := seam.StoreOf(b.store)
	key := recovery.Key{Tenant: "acme", ID: "k1"}
	p := params(t, key, `{"amount": 100}`)
	rec, _ := b.claim(t, p)

	require.NoError(t, b.store.Advance(b.ctx, rec.Fence(), "reserve", []byte(`{"n": 1}`)))
	require.Equal(t, recovery.Transition{At: b.last(t, key).At, Kind: recovery.TransitionPhaseCommitted, Owner: rec.Owner, Step: "reserve"},
		b.last(t, key))

	_, err := b.store.Renew(b.ctx, rec.Fence(), 0)
	require.NoError(t, err)
	require.Len(t, b.load(t, key).History, 2, "a renewal in time is no transition")
	b.expire(t, key)
	_, err = b.store.Renew(b.ctx, rec.Fence(), 0)
	require.NoError(t, err)
	late := b.last(t, key)
	require.Equal(t, recovery.TransitionRenewedLate, late.Kind)
	require.Equal(t, rec.Owner, late.Owner)
	require.Contains(t, late.Error, "the lease had ended")

	require.NoError(t, b.store.Release(b.ctx, rec.Fence(), "card network down"))
	released := b.last(t, key)
	require.Equal(t, recovery.Transition{At: released.At, Kind: recovery.TransitionReleased, Owner: rec.Owner, Step: "reserve",
		Error: "card network down"}, released, "the owner that released, not the retired token")

	rec, _ = b.claim(t, p)
	require.NoError(t, engine.HandBack(b.ctx, rec.Fence(), "caller went away"))
	rec, _ = b.claim(t, p)
	_, err = engine.HandBackFor(b.ctx, rec.Fence(), 0, "come back later", true)
	require.NoError(t, err)
	rec, _ = b.claim(t, p)
	require.NoError(t, engine.Park(b.ctx, rec.Fence(), "the definition changed"))
	parked := b.load(t, key)
	require.NoError(t, b.store.Unpark(b.ctx, parked.Fence(), "fp2", "an operator chose fp2"))
	resumed := b.last(t, key)
	require.Equal(t, parked.Owner, resumed.Owner)
	require.Equal(t, "fp2", resumed.Definition)

	rec, _ = b.claim(t, p)
	require.NoError(t, engine.Restamp(b.ctx, rec.Fence(), "fp2", "reserve", nil))
	require.Equal(t, "fp2", b.last(t, key).Definition)
	require.NoError(t, engine.Compensate(b.ctx, rec.Fence(), []string{"charge", "reserve"}, jsonResponse, nil, "card declined"))
	require.Equal(t, "card declined", b.last(t, key).Error)
	finished, err := engine.Undone(b.ctx, rec.Fence(), "charge", []byte(`{}`))
	require.NoError(t, err)
	require.False(t, finished)
	finished, err = engine.Undone(b.ctx, rec.Fence(), "reserve", []byte(`{}`))
	require.NoError(t, err)
	require.True(t, finished)

	h := b.load(t, key).History
	require.Equal(t, []recovery.TransitionKind{
		recovery.TransitionClaimed, recovery.TransitionPhaseCommitted, recovery.TransitionLeaseExpired,
		recovery.TransitionRenewedLate, recovery.TransitionReleased,
		recovery.TransitionTakenOver, recovery.TransitionHandedBack,
		recovery.TransitionTakenOver, recovery.TransitionDeferred,
		recovery.TransitionTakenOver, recovery.TransitionParked, recovery.TransitionResumedAs,
		recovery.TransitionTakenOver, recovery.TransitionRestamped, recovery.TransitionCompensating,
		recovery.TransitionUndone, recovery.TransitionUndone, recovery.TransitionCompensated,
	}, kinds(h))
	require.Equal(t, "charge", h[15].Step)
	require.Equal(t, "reserve", h[16].Step)
	for i := 1; i < len(h); i++ {
		require.False(t, h[i].At.Before(h[i-1].At), "entry %d is in order", i)
	}
}

func TestHistoryNamesHowARecordFinished(t *testing.T) {
	b := setup(t)
	engine := seam.StoreOf(b.store)
	claim := func(id string) (recovery.Key, *recovery.Record) {
		key := recovery.Key{Tenant: "acme", ID: id}
		rec, _ := b.claim(t, params(t, key, `{}`))
		return key, rec
	}
	failure := recovery.Response{Status: 500, Body: []byte("no")}

	key, rec := claim("completed")
	require.NoError(t, b.store.Complete(b.ctx, rec.Fence(), jsonResponse))
	require.Equal(t, recovery.TransitionCompleted, b.last(t, key).Kind)

	key, rec = claim("completed-after")
	require.NoError(t, engine.CompleteAfter(b.ctx, rec.Fence(), "ship", []byte(`{}`), jsonResponse))
	require.Equal(t, recovery.Transition{At: b.last(t, key).At, Kind: recovery.TransitionCompleted, Owner: rec.Owner, Step: "ship"},
		b.last(t, key))

	key, rec = claim("failed")
	long := strings.Repeat("é", recovery.MaxHistoryError+50)
	require.NoError(t, b.store.Fail(b.ctx, rec.Fence(), failure, long))
	failed := b.last(t, key)
	require.Equal(t, recovery.TransitionFailed, failed.Kind)
	require.Equal(t, strings.Repeat("é", recovery.MaxHistoryError), failed.Error, "cut to MaxHistoryError characters")
	require.Equal(t, long, b.load(t, key).LastError, "the last error keeps it whole")

	key, rec = claim("released-by-operator")
	b.expire(t, key)
	require.NoError(t, engine.ReleaseLeaseOver(b.ctx, rec.Fence(), "released by an operator: stuck"))
	require.Equal(t, recovery.TransitionReleasedByOperator, b.last(t, key).Kind)
	rec, _ = b.claim(t, params(t, key, `{}`))
	require.NoError(t, engine.ForceRelease(b.ctx, rec.Fence(), "released by an operator: forced"))
	require.Equal(t, recovery.Transition{At: b.last(t, key).At, Kind: recovery.TransitionReleasedByOperator, Owner: rec.Owner,
		Error: "released by an operator: forced"}, b.last(t, key))

	key, rec = claim("failed-by-operator")
	b.expire(t, key)
	require.NoError(t, engine.FailLeaseOver(b.ctx, rec.Fence(), failure, "failed by an operator"))
	require.Equal(t, recovery.TransitionFailedByOperator, b.last(t, key).Kind)

	key, rec = claim("forced-fail")
	require.NoError(t, engine.ForceFail(b.ctx, rec.Fence(), failure, "failed by an operator: forced"))
	require.Equal(t, recovery.TransitionFailedByOperator, b.last(t, key).Kind)
}

// TestHistoryAppendIsInlined: onceflow_history is a SQL function that the
// planner inlines into each statement that records a transition (migration
// 0015), rather than a call into PL/pgSQL per statement, which cost every
// workflow a quarter of its throughput.
func TestHistoryAppendIsInlined(t *testing.T) {
	b := setup(t)
	var plan []string
	rows, err := b.db.Query(b.ctx, `EXPLAIN (VERBOSE, COSTS OFF)
UPDATE onceflow_keys SET history = onceflow_history(history, 'phase_committed', owner, 'step')
WHERE tenant_id = 'acme' AND key = 'k'`)
	require.NoError(t, err)
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err())
	text := strings.Join(plan, "\n")
	require.Contains(t, text, "jsonb_build_object", "the expression is in the plan")
	require.NotContains(t, text, "onceflow_history(", "no function call is left in the plan")
}

// TestEveryHistoryAppendIsInlined: each statement of the store that records
// a transition has onceflow_history inlined into its plan (migration 0015),
// not only a statement written for the test: the planner inlines a call
// only when its history argument, which the body reads five times, is
// cheap and not volatile, and only while the function keeps the form
// inlining needs (no SET clause, not STRICT, one SELECT). The one call left
// is the outer one of the last compensation, whose history argument is the
// inner call's expression (clock_timestamp() is volatile); it runs as a
// plain SQL function call (TestNestedHistoryAppendAtTheCap).
func TestEveryHistoryAppendIsInlined(t *testing.T) {
	b := setup(t)
	calls := map[string]int{"undone": 1}
	checked := 0
	for name, sql := range recovery.StatementsOf(b.store) {
		if !strings.Contains(sql, "onceflow_history(") {
			continue
		}
		checked++
		conn, err := b.db.Acquire(b.ctx)
		require.NoError(t, err)
		// The parameters' types, inferred by the server, give every one a NULL.
		desc, err := conn.Conn().Prepare(b.ctx, "", "EXPLAIN (VERBOSE, COSTS OFF) "+sql)
		require.NoError(t, err, name)
		rows, err := conn.Query(b.ctx, "EXPLAIN (VERBOSE, COSTS OFF) "+sql, make([]any, len(desc.ParamOIDs))...)
		require.NoError(t, err, name)
		var plan strings.Builder
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan.WriteString(line + "\n")
		}
		require.NoError(t, rows.Err(), name)
		conn.Release()
		require.Contains(t, plan.String(), "jsonb_build_object", "%s: the append is in the plan", name)
		require.Equal(t, calls[name], strings.Count(plan.String(), "onceflow_history("),
			"%s: calls of onceflow_history left in the plan:\n%s", name, plan.String())
	}
	require.GreaterOrEqual(t, checked, 10, "the statements that record transitions were found")
}

// TestNestedHistoryAppendAtTheCap: a call of onceflow_history the planner
// does not inline (the last compensation's outer one) appends as an inlined
// one does: at MaxHistory entries, the oldest is dropped and counted.
func TestNestedHistoryAppendAtTheCap(t *testing.T) {
	b := setup(t)
	var (
		truncated, n int
		first, last  string
		kinds        []string
	)
	require.NoError(t, b.db.QueryRow(b.ctx, `
WITH h AS (SELECT jsonb_build_object('truncated', 7, 'entries',
    (SELECT jsonb_agg(jsonb_build_object('kind', 'k' || i)) FROM generate_series(1, $1::int) i)) AS h),
appended AS (SELECT onceflow_history(onceflow_history(h, 'undone', NULL, 's'), 'compensated', NULL, 's') AS a FROM h)
SELECT (a->>'truncated')::int, jsonb_array_length(a->'entries'), a->'entries'->0->>'kind',
       a->'entries'->-3->>'kind', ARRAY[a->'entries'->-2->>'kind', a->'entries'->-1->>'kind'] FROM appended`,
		recovery.MaxHistory-1).Scan(&truncated, &n, &first, &last, &kinds))
	require.Equal(t, recovery.MaxHistory, n)
	require.Equal(t, 8, truncated, "one entry dropped and counted")
	require.Equal(t, "k2", first)
	require.Equal(t, fmt.Sprintf("k%d", recovery.MaxHistory-1), last)
	require.Equal(t, []string{"undone", "compensated"}, kinds)
}

// TestHistoryEntriesOmitNulls: an entry stores only the members it has, so
// that every transition logs no more bytes than it says.
func TestHistoryEntriesOmitNulls(t *testing.T) {
	b := setup(t)
	key := recovery.Key{Tenant: "acme", ID: "k"}
	b.claim(t, params(t, key, `{}`))
	var raw string
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT history::text FROM onceflow_keys WHERE tenant_id = $1 AND key = $2`,
		key.Tenant, key.ID).Scan(&raw))
	require.Contains(t, raw, `"kind": "claimed"`)
	require.NotContains(t, raw, "null")
}
