package admin_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/admin"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/recovery"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// bundle is what most tests need: a fresh database, a store to make
// records with, and an Admin over them.
type bundle struct {
	ctx   context.Context
	db    *pgxpool.Pool
	store *recovery.Store
	admin *admin.Admin
}

// writer lets every request act: the Go API tests do not go through HTTP.
func writer(*http.Request) (admin.Role, error) { return admin.RoleWrite, nil }

func setup(t *testing.T, cfg admin.Config) *bundle {
	t.Helper()
	t.Parallel()
	db := dbtest.NewPool(t, 8)
	store, err := recovery.New(db, recovery.Config{})
	require.NoError(t, err)
	if cfg.Authorize == nil {
		cfg.Authorize = writer
	}
	a, err := admin.New(db, cfg)
	require.NoError(t, err)
	return &bundle{ctx: context.Background(), db: db, store: store, admin: a}
}

// claim makes an in-flight record of workflow under key, its lease valid
// for the store's whole lease.
func (b *bundle) claim(t *testing.T, key recovery.Key, workflow string) *recovery.Record {
	t.Helper()
	req := fmt.Sprintf(`{"order": %q}`, key.ID)
	fp, canon, err := recovery.FingerprintJSON(workflow, []byte(req))
	require.NoError(t, err)
	rec, _, err := b.store.Claim(b.ctx, recovery.ClaimParams{Key: key, Workflow: workflow, Fingerprint: fp, Request: canon})
	require.NoError(t, err)
	return rec
}

// stuck makes an in-flight record whose holder stopped: its lease is over.
func (b *bundle) stuck(t *testing.T, key recovery.Key, workflow string) *recovery.Record {
	t.Helper()
	b.claim(t, key, workflow)
	require.NoError(t, b.store.ExpireLease(b.ctx, key))
	return b.load(t, key)
}

func (b *bundle) completed(t *testing.T, key recovery.Key, workflow string) *recovery.Record {
	t.Helper()
	rec := b.claim(t, key, workflow)
	require.NoError(t, b.store.Advance(b.ctx, rec.Fence(), "create_order", []byte(`{"order_id": 7}`)))
	require.NoError(t, b.store.Complete(b.ctx, rec.Fence(), recovery.Response{
		Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"order_id": 7}`),
	}))
	return b.load(t, key)
}

func (b *bundle) parked(t *testing.T, key recovery.Key, workflow string) *recovery.Record {
	t.Helper()
	rec := b.claim(t, key, workflow)
	require.NoError(t, seam.StoreOf(b.store).Park(b.ctx, rec.Fence(), "step charge changed"))
	return b.load(t, key)
}

func (b *bundle) compensating(t *testing.T, key recovery.Key, workflow string) *recovery.Record {
	t.Helper()
	rec := b.claim(t, key, workflow)
	require.NoError(t, b.store.Advance(b.ctx, rec.Fence(), "charge", []byte(`{}`)))
	require.NoError(t, seam.StoreOf(b.store).Compensate(b.ctx, rec.Fence(), []string{"charge"},
		recovery.Response{Status: 500, Body: []byte("no")}, nil, "record_charge failed for good"))
	return b.load(t, key)
}

func (b *bundle) load(t *testing.T, key recovery.Key) *recovery.Record {
	t.Helper()
	rec, err := b.store.Load(b.ctx, key)
	require.NoError(t, err)
	return rec
}

// keys returns the keys of recs, in order.
func keys(recs []admin.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.Tenant + "/" + r.Key
	}
	return out
}

func key(tenant, id string) recovery.Key { return recovery.Key{Tenant: tenant, ID: id} }
