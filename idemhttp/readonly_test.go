package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// TestMiddlewareOnAReadOnlyServer: after a failover, a pool's connections
// can be on a standby, which refuses every write with SQLSTATE 25006. The
// request is answered 503 with Retry-After, its handler not run, and the
// pool's connections are closed: once writes are taken again (the pool's
// next connections reach the new primary), the retry runs with the same
// pool, no restart. Straight to PostgreSQL: behind PgBouncer the server
// sessions are PgBouncer's, which no app pool can reset.
func TestMiddlewareOnAReadOnlyServer(t *testing.T) {
	t.Parallel()
	url := dbtest.DirectURL(t, dbtest.NewDatabase(t, dbtest.Options{}))
	pool := dbtest.Connect(t, url, 2)
	s := newServerOn(t, pool, idemhttp.Config{}, nil)

	dbtest.SetReadOnly(t, url, true)
	pool.Reset() // the pool's connections now land on a "standby"
	refused := s.post("/v1/charges", "k1", "acme", `{"amount": 1}`)
	require.Equal(t, http.StatusServiceUnavailable, refused.status, refused.body)
	require.Equal(t, "1", refused.header.Get("Retry-After"))
	require.Zero(t, s.runs.Load(), "nothing runs without the key's protection")

	dbtest.SetReadOnly(t, url, false) // the new primary
	done := s.post("/v1/charges", "k1", "acme", `{"amount": 1}`)
	require.Equal(t, http.StatusCreated, done.status, "a connection still on the read-only server was reused: %s", done.body)
	require.EqualValues(t, 1, s.runs.Load())
	require.Equal(t, 1, s.rows())
}

// TestWorkflowStepOnAReadOnlyServerIs503: a write refused as read-only in
// the middle of a workflow (its transaction on a standby) is a step that
// failed for want of a database, not of the request: 503 with
// Retry-After, the key kept, and the retry resumes it.
func TestWorkflowStepOnAReadOnlyServerIs503(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t, 4)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE payments (id bigserial PRIMARY KEY, charge text)`)
	require.NoError(t, err)
	var readOnlyOnce atomic.Bool
	readOnlyOnce.Store(true)
	wf := workflow.Define("pay",
		phase.Atomic("insert", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Payment, Paid]) error {
			return tx.QueryRow(ctx, `INSERT INTO payments DEFAULT VALUES RETURNING id`).Scan(&r.State.Row)
		}),
		phase.Foreign("charge", func(ctx context.Context, r *phase.Run[Payment, Paid]) error { return nil }),
		phase.Atomic("record", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Payment, Paid]) error {
			if readOnlyOnce.Swap(false) {
				if _, err := tx.Exec(ctx, `SET TRANSACTION READ ONLY`); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `UPDATE payments SET charge = 'ch_1' WHERE id = $1`, r.State.Row)
			return err
		}),
	).Finish(func(s *Paid) workflow.Response { return workflow.JSON(http.StatusCreated, s) })
	engine, err := workflow.NewEngine(pool, workflow.Config{})
	require.NoError(t, err)
	h, err := idemhttp.Workflow(engine, wf, idemhttp.WorkflowConfig{Tenant: trustedTenant})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s := &server{t: t, db: pool, url: srv.URL}

	refused := s.post("/", "k1", "acme", `{"amount_cents": 500}`)
	require.Equal(t, http.StatusServiceUnavailable, refused.status, refused.body)
	require.Equal(t, "1", refused.header.Get("Retry-After"))
	require.Contains(t, problemOf(t, refused), "retry with the same key")

	done := s.post("/", "k1", "acme", `{"amount_cents": 500}`)
	require.Equal(t, http.StatusCreated, done.status, done.body)
	var charged int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM payments WHERE charge = 'ch_1'`).Scan(&charged))
	require.Equal(t, 1, charged, "resumed, not run anew")
}
