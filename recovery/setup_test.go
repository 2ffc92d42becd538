package recovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/recovery"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// bundle is what most tests need: a fresh database and a store on it.
type bundle struct {
	ctx   context.Context
	db    *pgxpool.Pool
	store *recovery.Store
}

func setup(t *testing.T) *bundle {
	t.Helper()
	t.Parallel()
	return setupWith(t, dbtest.NewPool(t, 8))
}

func setupWith(t *testing.T, db *pgxpool.Pool) *bundle {
	t.Helper()
	store, err := recovery.New(db, recovery.Config{})
	require.NoError(t, err)
	return &bundle{ctx: context.Background(), db: db, store: store}
}

// params returns claim parameters for a JSON request under key.
func params(t *testing.T, key recovery.Key, request string) recovery.ClaimParams {
	t.Helper()
	fp, canon, err := recovery.FingerprintJSON("checkout", []byte(request))
	require.NoError(t, err)
	return recovery.ClaimParams{Key: key, Workflow: "checkout", Fingerprint: fp, Request: canon}
}

func (b *bundle) claim(t *testing.T, p recovery.ClaimParams) (*recovery.Record, recovery.Outcome) {
	t.Helper()
	rec, outcome, err := b.store.Claim(b.ctx, p)
	require.NoError(t, err)
	return rec, outcome
}

func (b *bundle) load(t *testing.T, key recovery.Key) *recovery.Record {
	t.Helper()
	rec, err := b.store.Load(b.ctx, key)
	require.NoError(t, err)
	return rec
}

// expire ends a record's lease now, as if its holder had stopped renewing
// it. Tests use it instead of sleeping for a whole lease.
func (b *bundle) expire(t *testing.T, key recovery.Key) {
	t.Helper()
	require.NoError(t, b.store.ExpireLease(b.ctx, key))
}

func (b *bundle) count(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM onceflow_keys`).Scan(&n))
	return n
}

// rowVersion identifies the physical row version, to prove a read wrote
// nothing.
func (b *bundle) rowVersion(t *testing.T, key recovery.Key) string {
	t.Helper()
	var v string
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT xmin::text || ctid::text FROM onceflow_keys
		WHERE tenant_id = $1 AND key = $2`, key.Tenant, key.ID).Scan(&v))
	return v
}

var jsonResponse = recovery.Response{
	Status: 201,
	Header: map[string][]string{"Content-Type": {"application/json"}},
	Body:   []byte(`{"order_id": "o_1", "amount": 100}`),
}

func within(t *testing.T, want, got time.Duration, tolerance time.Duration) {
	t.Helper()
	require.InDelta(t, want.Seconds(), got.Seconds(), tolerance.Seconds(), "want %s, got %s", want, got)
}
