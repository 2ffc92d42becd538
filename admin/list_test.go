package admin_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/admin"
	"github.com/onceflow/onceflow/recovery"
)

func TestListFilters(t *testing.T) {
	b := setup(t, admin.Config{})
	b.claim(t, key("acme", "live"), "checkout")
	b.stuck(t, key("acme", "stuck"), "checkout")
	b.completed(t, key("acme", "done"), "checkout")
	b.parked(t, key("acme", "parked"), "checkout")
	b.compensating(t, key("acme", "undoing"), "checkout")
	b.stuck(t, key("globex", "refund"), "refund")
	var between time.Time
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT clock_timestamp()`).Scan(&between))
	b.completed(t, key("globex", "late"), "refund")

	list := func(f admin.Filter) []string {
		t.Helper()
		page, err := b.admin.List(b.ctx, f)
		require.NoError(t, err)
		return keys(page.Records)
	}
	require.Equal(t, []string{"acme/live", "acme/stuck", "acme/done", "acme/parked", "acme/undoing", "globex/refund", "globex/late"},
		list(admin.Filter{}), "least recently updated first")
	require.Equal(t, []string{"globex/late", "globex/refund"}, list(admin.Filter{Tenant: "globex", Newest: true}))
	require.Equal(t, []string{"globex/refund", "globex/late"}, list(admin.Filter{Workflow: "refund"}))
	require.Equal(t, []string{"acme/live", "acme/stuck", "acme/undoing", "globex/refund"},
		list(admin.Filter{Status: recovery.StatusInFlight}), "in flight includes compensating")
	require.Equal(t, []string{"acme/undoing"}, list(admin.Filter{Status: admin.StatusCompensating}))
	require.Equal(t, []string{"acme/parked"}, list(admin.Filter{Status: recovery.StatusParked}))
	require.Equal(t, []string{"acme/done", "globex/late"}, list(admin.Filter{Status: recovery.StatusCompleted}))
	require.Equal(t, []string{"globex/late"}, list(admin.Filter{CreatedFrom: between}))
	require.Equal(t, []string{"acme/live", "acme/stuck", "acme/done", "acme/parked", "acme/undoing", "globex/refund"},
		list(admin.Filter{CreatedTo: between}))

	// Stuck: in flight, no progress for longer than StuckFor. Age every
	// record's last progress by an hour except the live one's.
	_, err := b.db.Exec(b.ctx, `UPDATE onceflow_keys SET updated_at = updated_at - interval '1 hour' WHERE key <> 'live'`)
	require.NoError(t, err)
	require.Equal(t, []string{"acme/stuck", "acme/undoing", "globex/refund"}, list(admin.Filter{StuckFor: 30 * time.Minute}))

	_, err = b.admin.List(b.ctx, admin.Filter{Status: "stuck"})
	require.ErrorIs(t, err, admin.ErrInvalidInput)
	_, err = b.admin.List(b.ctx, admin.Filter{Limit: admin.LimitMax + 1})
	require.ErrorIs(t, err, admin.ErrInvalidInput)
	_, err = b.admin.List(b.ctx, admin.Filter{Cursor: "not-a-cursor"})
	require.ErrorIs(t, err, admin.ErrInvalidInput)
}

// TestListPagesCoverEveryRecordOnce: keyset pages of records that share
// one updated_at (the tie is broken by tenant and key) list each record
// exactly once, in either order.
func TestListPagesCoverEveryRecordOnce(t *testing.T) {
	b := setup(t, admin.Config{})
	var want []string
	for _, tenant := range []string{"acme", "globex"} {
		for _, id := range []string{"a", "b", "c", "d"} {
			b.stuck(t, key(tenant, id), "checkout")
			want = append(want, tenant+"/"+id)
		}
	}
	_, err := b.db.Exec(b.ctx, `UPDATE onceflow_keys SET updated_at = '2026-01-01T00:00:00.123456Z'`)
	require.NoError(t, err)

	for _, newest := range []bool{false, true} {
		var got []string
		f := admin.Filter{Limit: 3, Newest: newest}
		for pages := 0; ; pages++ {
			require.Less(t, pages, 4, "three pages hold eight records")
			page, err := b.admin.List(b.ctx, f)
			require.NoError(t, err)
			require.LessOrEqual(t, len(page.Records), 3)
			got = append(got, keys(page.Records)...)
			if page.Next == "" {
				break
			}
			f.Cursor = page.Next
		}
		expect := want
		if newest {
			expect = reversed(want)
		}
		require.Equal(t, expect, got, "newest first: %v", newest)
	}
}

func reversed(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}

func TestShow(t *testing.T) {
	b := setup(t, admin.Config{})
	rec := b.completed(t, key("acme", "order/42"), "checkout")

	d, err := b.admin.Show(b.ctx, key("acme", "order/42"))
	require.NoError(t, err)
	require.Equal(t, rec.ID.String(), d.ID)
	require.Equal(t, rec.Owner, d.Owner)
	require.Equal(t, recovery.StatusCompleted, d.Status)
	require.Equal(t, "create_order", d.RecoveryPoint)
	require.JSONEq(t, `{"order": "order/42"}`, string(d.Request))
	require.JSONEq(t, `{"order_id": 7}`, string(d.State))
	require.Equal(t, 201, d.Response.Status)
	require.JSONEq(t, `{"order_id": 7}`, string(d.Response.Body), "a JSON body is shown as JSON")
	require.NotNil(t, d.CompletedAt)

	_, err = b.admin.Show(b.ctx, key("acme", "nope"))
	require.ErrorIs(t, err, admin.ErrNotFound)
	_, err = b.admin.Show(b.ctx, key("", "nope"))
	require.ErrorIs(t, err, admin.ErrInvalidInput)
}
