package idemhttp_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/workflow"
)

// skewedPool is a pool on a database of t's own whose clock is an hour
// ahead of this process's.
func skewedPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return dbtest.Connect(t, dbtest.NewSkewedDatabase(t, time.Hour, dbtest.Options{}), 8)
}

// requireExpiryHolds checks r's Idempotency-Key-Expires, about key's
// finished record in db, against both clocks: it is at most lifetime after
// r's Date, the process's clock, which a client reads it against; and it
// is no later than the moment the pruner may forget the record by the
// database's clock (its completion plus lifetime), placed on the process's
// clock by the time the database says is left.
func requireExpiryHolds(t *testing.T, db *pgxpool.Pool, key string, r reply, lifetime time.Duration) {
	t.Helper()
	at := expiresOf(t, r)
	date, err := http.ParseTime(r.header.Get("Date"))
	require.NoError(t, err)
	require.LessOrEqual(t, at.Sub(date), lifetime, "Idempotency-Key-Expires %s, Date %s", at, date)

	var leftMicros int64
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT (extract(epoch FROM completed_at + $2::bigint * interval '1 microsecond' - clock_timestamp()) * 1e6)::bigint
		 FROM onceflow_keys WHERE key = $1`, key, lifetime.Microseconds()).Scan(&leftMicros))
	kept := time.Now().Add(time.Duration(leftMicros) * time.Microsecond) // at the latest: read after the database's clock
	require.False(t, at.After(kept), "Idempotency-Key-Expires %s is after %s, when the pruner may forget the key", at, kept)
}

// TestKeyLifetimeOnASkewedDatabase: the pruner forgets a record by the
// database's clock (its completion), while a client reads
// Idempotency-Key-Expires against Date, the process's clock. On a database
// an hour ahead, the handler's answer and its replay both advertise an
// expiry the lifetime after Date at most, and never after the pruner may
// forget the key: a replay's expiry is placed by how long ago the record
// finished, as the database tells it, not by the database's reading of
// its completion. A replay used to advertise an hour more, and a retry
// inside it, after the pruner ran, ran the handler again.
//
// Mutation caught: a replay's expiry taken from the record's completion
// as the database's clock read it (replay-expiry-database-clock).
func TestKeyLifetimeOnASkewedDatabase(t *testing.T) {
	t.Parallel()
	const lifetime = 10 * time.Minute
	pool := skewedPool(t)
	s := newServerOn(t, pool, idemhttp.Config{KeyLifetime: lifetime}, nil)
	created := s.post("/v1/charges", "k1", "acme", `{}`)
	require.Equal(t, http.StatusCreated, created.status, created.body)
	requireExpiryHolds(t, pool, "k1", created, lifetime)

	replay := s.post("/v1/charges", "k1", "acme", `{}`)
	require.Equal(t, "true", replay.header.Get(idemhttp.ReplayedHeader))
	requireExpiryHolds(t, pool, "k1", replay, lifetime)
	require.EqualValues(t, 1, s.runs.Load())
}

// TestWorkflowKeyLifetimeOnASkewedDatabase is
// TestKeyLifetimeOnASkewedDatabase through Workflow.
//
// Mutation caught: a workflow replay's expiry taken from the record's
// completion as the database's clock read it
// (workflow-replay-expiry-database-clock).
func TestWorkflowKeyLifetimeOnASkewedDatabase(t *testing.T) {
	t.Parallel()
	const lifetime = 10 * time.Minute
	pool := skewedPool(t)
	s := newWorkflowServerOnPool(t, pool, idemhttp.WorkflowConfig{Tenant: trustedTenant, KeyLifetime: lifetime}, workflow.Config{})
	created := s.post("/v1/charges", "k1", "acme", `{"amount_cents": 500}`)
	require.Equal(t, http.StatusCreated, created.status, created.body)
	requireExpiryHolds(t, pool, "k1", created, lifetime)

	replay := s.post("/v1/charges", "k1", "acme", `{"amount_cents": 500}`)
	require.Equal(t, "true", replay.header.Get(idemhttp.ReplayedHeader))
	requireExpiryHolds(t, pool, "k1", replay, lifetime)
	require.EqualValues(t, 1, s.runs.Load())
}
