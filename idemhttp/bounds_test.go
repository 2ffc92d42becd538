package idemhttp_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/workflow"
)

// lockedUntil reads acme's k1 lease end, by the database clock.
func (s *server) lockedUntil() time.Time {
	s.t.Helper()
	var until time.Time
	require.NoError(s.t, s.db.QueryRow(context.Background(),
		`SELECT locked_until FROM onceflow_keys WHERE tenant_id = 'acme' AND key = 'k1'`).Scan(&until))
	return until
}

// TestCompletesOnARepeatableReadServer: on a database whose default
// isolation is REPEATABLE READ, a handler whose transaction began before a
// lease renewal still has its response stored: the middleware's
// transaction is READ COMMITTED, so the completion sees the renewal.
//
// Before the fix, the completion failed with a serialization error: 503,
// and the handler ran again on every retry.
func TestCompletesOnARepeatableReadServer(t *testing.T) {
	t.Parallel()
	pool := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{
		Settings: map[string]string{"default_transaction_isolation": "repeatable read"}}), 16)
	const lease = time.Second
	s := newServerOn(t, pool, idemhttp.Config{Lease: lease}, nil)
	var claimedUntil time.Time
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		tx, err := idemhttp.Tx(r.Context())
		if err == nil {
			_, err = tx.Exec(r.Context(), `INSERT INTO charges (body) VALUES ('x')`) // the snapshot is taken
		}
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		claimedUntil = s.lockedUntil()
		for s.lockedUntil().Equal(claimedUntil) { // until a renewal moved the lease
			select {
			case <-r.Context().Done():
				http.Error(w, "stopped", 500)
				return
			case <-time.After(lease / 20):
			}
		}
		w.WriteHeader(http.StatusCreated)
	}
	require.Equal(t, http.StatusCreated, s.post("/v1/charges", "k1", "acme", `{}`).status)
	replay := s.post("/v1/charges", "k1", "acme", `{}`)
	require.Equal(t, http.StatusCreated, replay.status)
	require.Equal(t, "true", replay.header.Get(idemhttp.ReplayedHeader))
	require.Equal(t, 1, s.rows())
	require.Equal(t, int32(1), s.runs.Load())
}

// failingRenewals fails every lease renewal, as a database out of reach
// would, while the claim and the completion still go through.
type failingRenewals struct{ *pgxpool.Pool }

func (f failingRenewals) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if strings.Contains(sql, "RETURNING locked_until") {
		return errRow{errors.New("connection refused")}
	}
	return f.Pool.QueryRow(ctx, sql, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// TestHandlerIsStoppedBeforeItsLeaseEnds: with every renewal failing, the
// handler's context ends while its lease is still valid by the database
// clock, before another request could take the key over and run the
// handler beside it.
//
// Before the fix, the middleware's heartbeat had no deadline at all: the
// handler ran on past its lease.
func TestHandlerIsStoppedBeforeItsLeaseEnds(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second // real time is the point; the margin is a tenth of it
	s := newServerOn(t, dbtest.NewPool(t, 16), idemhttp.Config{Lease: lease},
		func(p *pgxpool.Pool) workflow.DB { return failingRenewals{p} })
	validAtCancel := make(chan bool, 1)
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			validAtCancel <- leaseValidAt(s, time.Now())
			http.Error(w, "stopped", http.StatusServiceUnavailable)
		case <-time.After(3 * lease):
			validAtCancel <- false
			w.WriteHeader(http.StatusCreated)
		}
	}
	require.Equal(t, http.StatusServiceUnavailable, s.post("/v1/charges", "k1", "acme", `{}`).status)
	require.True(t, <-validAtCancel, "the handler was stopped while its lease was valid")
}

// leaseValidAt reports whether acme's k1 lease was still valid at at. The
// test's database runs on this machine, unskewed, so its clock and the
// process's agree; comparing with the moment the handler saw its context
// end, rather than asking the database "now", keeps the query's own delay
// on a loaded machine out of the measure.
func leaseValidAt(s *server, at time.Time) bool {
	var until time.Time
	err := s.db.QueryRow(context.Background(),
		`SELECT locked_until FROM onceflow_keys WHERE tenant_id = 'acme' AND key = 'k1'`).Scan(&until)
	return err == nil && at.Before(until)
}

// TestDatabaseThatHangsGets503: with the key table locked by another
// session, or the pool given out, a request is answered 503 with
// Retry-After within Config.DBTimeout, and the handler does not run;
// unrelated requests do not hang either.
//
// Before the fix, such requests waited without bound.
func TestDatabaseThatHangsGets503(t *testing.T) {
	t.Parallel()
	const bound = 300 * time.Millisecond
	pool := dbtest.NewPool(t, 2)
	s := newServerOn(t, pool, idemhttp.Config{DBTimeout: bound}, nil)
	var ran atomic.Int32
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		s.charge(w, r)
	}
	check := func(key string) {
		t.Helper()
		r := s.post("/v1/charges", key, "acme", `{}`)
		require.Equal(t, http.StatusServiceUnavailable, r.status, r.body)
		require.NotEmpty(t, r.header.Get("Retry-After"))
		problemOf(t, r)
	}

	locker, err := pool.Begin(context.Background())
	require.NoError(t, err)
	_, err = locker.Exec(context.Background(), `LOCK TABLE onceflow_keys IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	check("k1")
	check("k2")
	require.NoError(t, locker.Rollback(context.Background()))

	held := make([]*pgxpool.Conn, 0, 2)
	for range 2 {
		c, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		held = append(held, c)
	}
	check("k3")
	for _, c := range held {
		c.Release()
	}
	require.Zero(t, ran.Load(), "no handler ran")

	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM onceflow_keys`).Scan(&n))
	require.Zero(t, n, "nothing was claimed")
}
