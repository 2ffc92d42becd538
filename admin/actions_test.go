package admin_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/admin"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// TestReleaseIsFencedByTheOwnerRead: an action presenting an owner token
// the record no longer has writes nothing.
func TestReleaseIsFencedByTheOwnerRead(t *testing.T) {
	b := setup(t, admin.Config{})
	k := key("acme", "order-1")
	read := b.stuck(t, k, "checkout")
	b.claim(t, k, "checkout") // a retry took the record over since the operator looked
	now := b.load(t, k)
	require.NotEqual(t, read.Owner, now.Owner)

	_, err := b.admin.Release(b.ctx, k, admin.Action{Owner: read.Owner, Force: true})
	require.ErrorIs(t, err, admin.ErrChanged)
	after := b.load(t, k)
	require.Equal(t, now.Owner, after.Owner, "the new holder keeps the record")
	require.Equal(t, now.Attempts, after.Attempts)

	_, err = b.admin.Release(b.ctx, k, admin.Action{})
	require.ErrorIs(t, err, admin.ErrInvalidInput, "the owner token is required")
}

// TestActionsRefuseALiveLeaseUnlessForced: a record whose lease is valid is
// left to its holder; forced, it is released and its holder fenced out.
func TestActionsRefuseALiveLeaseUnlessForced(t *testing.T) {
	b := setup(t, admin.Config{})
	k := key("acme", "order-1")
	rec := b.claim(t, k, "checkout")

	for _, act := range []func(context.Context, recovery.Key, admin.Action) (*admin.Record, error){
		b.admin.Release, b.admin.Fail, b.admin.ResumeNow,
	} {
		_, err := act(b.ctx, k, admin.Action{Owner: rec.Owner, Reason: "stuck"})
		var live *admin.LiveLeaseError
		require.ErrorAs(t, err, &live)
		require.True(t, live.Until.Equal(rec.LockedUntil), "the error says until when")
		require.Equal(t, rec.Owner, b.load(t, k).Owner, "nothing was written")
	}

	got, err := b.admin.Release(b.ctx, k, admin.Action{Owner: rec.Owner, Force: true, Reason: "deploy stuck"})
	require.NoError(t, err)
	require.True(t, got.Released)
	require.Equal(t, 1, got.Attempts)
	require.Equal(t, "released by an operator: deploy stuck", got.LastError)
	require.NotEqual(t, rec.Owner, got.Owner)
	require.ErrorIs(t, b.store.Advance(b.ctx, rec.Fence(), "create_order", []byte(`{}`)), recovery.ErrLeaseLost,
		"the holder is fenced out")
	h := b.load(t, k).History
	require.Equal(t, recovery.TransitionReleasedByOperator, h[len(h)-1].Kind, "the history names the operator, forced or not")

	rec = b.claim(t, k, "checkout")
	_, err = b.admin.Fail(b.ctx, k, admin.Action{Owner: rec.Owner, Force: true, Reason: "refunded by hand"})
	require.NoError(t, err)
	h = b.load(t, k).History
	require.Equal(t, recovery.TransitionFailedByOperator, h[len(h)-1].Kind)
}

func TestReleaseAndFail(t *testing.T) {
	b := setup(t, admin.Config{})
	stuck := b.stuck(t, key("acme", "stuck"), "checkout")
	got, err := b.admin.Release(b.ctx, stuck.Key, admin.Action{Owner: stuck.Owner})
	require.NoError(t, err, "a lease that is over needs no force")
	require.True(t, got.Released)

	parked := b.parked(t, key("acme", "parked"), "checkout")
	got, err = b.admin.Fail(b.ctx, parked.Key, admin.Action{Owner: parked.Owner, Reason: "refunded by hand"})
	require.NoError(t, err, "a parked record holds no lease")
	require.Equal(t, recovery.StatusFailed, got.Status)
	rec := b.load(t, parked.Key)
	require.Equal(t, 500, rec.Response.Status, "retries get a stored 500")
	require.Equal(t, "failed by an operator: refunded by hand", rec.LastError)

	_, err = b.admin.Release(b.ctx, parked.Key, admin.Action{Owner: rec.Owner, Force: true})
	require.ErrorIs(t, err, admin.ErrFinished)
	_, err = b.admin.Fail(b.ctx, key("acme", "nope"), admin.Action{Owner: uuid.New()})
	require.ErrorIs(t, err, admin.ErrNotFound)
}

// TestResumeNowRunsTheWorkflow: with an Engine that registers the record's
// workflow, ResumeNow finishes a crashed checkout at once, from its
// recovery point.
func TestResumeNowRunsTheWorkflow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.NewPool(t, 8)
	_, err := db.Exec(ctx, testapp.Schema)
	require.NoError(t, err)
	provider := testapp.NewProvider(t)
	wf := testapp.Checkout(provider.URL, testapp.Options{})
	crashing, err := workflow.NewEngine(db, workflow.Config{Hooks: &workflow.Hooks{
		CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
			if p == (workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"}) {
				return errors.New("killed")
			}
			return nil
		}}})
	require.NoError(t, err)
	k := key("acme", "order-1")
	_, err = wf.Run(ctx, crashing, k, testapp.Order{Customer: "ann", Amount: 100, Card: "4242"})
	require.ErrorIs(t, err, workflow.ErrCrashed)
	rec, err := crashing.Store().Load(ctx, k)
	require.NoError(t, err)

	engine, err := workflow.NewEngine(db, workflow.Config{Workflows: []workflow.Definition{wf}})
	require.NoError(t, err)
	a, err := admin.New(db, admin.Config{Authorize: writer, Engine: engine})
	require.NoError(t, err)
	got, err := a.ResumeNow(ctx, k, admin.Action{Owner: rec.Owner, Force: true, Reason: "provider is back"})
	require.NoError(t, err)
	require.Equal(t, recovery.StatusCompleted, got.Status, "the engine ran the rest of the checkout")
	require.Equal(t, 1, provider.Effects("charges"))
}

// TestResumeNowWithoutEngineReleases: without an Engine, ResumeNow
// releases the record: the next claim or the completer takes it over.
func TestResumeNowWithoutEngineReleases(t *testing.T) {
	b := setup(t, admin.Config{})
	stuck := b.stuck(t, key("acme", "order-2"), "checkout")
	got, err := b.admin.ResumeNow(b.ctx, stuck.Key, admin.Action{Owner: stuck.Owner})
	require.NoError(t, err)
	require.Equal(t, recovery.StatusInFlight, got.Status)
	require.True(t, got.Released)
}

// TestBulk: a bulk release takes at most MaxBulk records, each fenced on
// its own, skips those it may not touch and says there are more.
func TestBulk(t *testing.T) {
	b := setup(t, admin.Config{MaxBulk: 3})
	b.claim(t, key("acme", "a-live"), "checkout")
	for _, id := range []string{"b", "c", "d"} {
		b.stuck(t, key("acme", id), "checkout")
	}
	b.completed(t, key("acme", "e-done"), "checkout")

	_, err := b.admin.Bulk(b.ctx, admin.Bulk{Action: admin.KindRelease})
	require.ErrorIs(t, err, admin.ErrInvalidInput, "an empty filter is refused")

	rep, err := b.admin.Bulk(b.ctx, admin.Bulk{Action: admin.KindRelease, Filter: admin.Filter{Tenant: "acme"}, Reason: "outage"})
	require.NoError(t, err)
	require.Equal(t, 3, rep.Matched)
	require.True(t, rep.More)
	require.Equal(t, 2, rep.Done)
	require.Len(t, rep.Skipped, 1)
	require.Equal(t, "a-live", rep.Skipped[0].Key)
	require.Contains(t, rep.Skipped[0].Reason, "lease")
	require.Empty(t, rep.Errors)

	// The released b and c moved to the end of the order: the next run
	// takes the live record, d, then b.
	rep, err = b.admin.Bulk(b.ctx, admin.Bulk{Action: admin.KindRelease, Filter: admin.Filter{Status: recovery.StatusInFlight}})
	require.NoError(t, err)
	require.Equal(t, 3, rep.Matched)
	require.True(t, rep.More)
	require.Equal(t, 2, rep.Done)
	require.Len(t, rep.Skipped, 1)
	for id, attempts := range map[string]int{"a-live": 0, "b": 2, "c": 1, "d": 1} {
		require.Equal(t, attempts, b.load(t, key("acme", id)).Attempts, "key %s: each record taken once per run", id)
	}
}
