package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// TestWorkflowHandlerAnswersAParkedRecord503: a charge fails after its
// insert committed; the next release, which inserts a step before the
// charge, is deployed, and the client retries. Its first retry parks the
// record, and every retry, to the new release or to an old process still
// running, is answered the same 503 problem with Retry-After: 60 and runs
// nothing: no step of either version, no second charge.
func TestWorkflowHandlerAnswersAParkedRecord503(t *testing.T) {
	s := newWorkflowServer(t)
	s.failCharge.Store(1)
	const body = `{"amount_cents": 500}`
	failed := s.post("/v1/charges", "k1", "acme", body)
	require.Equal(t, http.StatusInternalServerError, failed.status, failed.body)

	var ran atomic.Int32 // steps of the next release that ran
	step := func(name string) phase.Step[Payment, Paid] {
		return phase.Atomic(name, func(context.Context, pgx.Tx, *phase.Run[Payment, Paid]) error {
			ran.Add(1)
			return nil
		})
	}
	next := workflow.Define("pay", step("insert"), step("verify"),
		foreign.Mutation("charge", func(context.Context, *foreign.Call[Payment, Paid]) error {
			ran.Add(1)
			return nil
		}),
		step("record"),
	).Version("2").Finish(func(p *Paid) workflow.Response { return workflow.JSON(http.StatusCreated, p) })
	engine, err := workflow.NewEngine(s.db, workflow.Config{})
	require.NoError(t, err)
	h, err := idemhttp.Workflow(engine, next, idemhttp.WorkflowConfig{Tenant: trustedTenant})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	deployed := &server{t: t, db: s.db, url: srv.URL}

	var first reply
	for i, to := range []*server{deployed, deployed, s.server, deployed} {
		r := to.post("/v1/charges", "k1", "acme", body)
		require.Equal(t, http.StatusServiceUnavailable, r.status, "retry %d: %s", i, r.body)
		require.Equal(t, "60", r.header.Get("Retry-After"), "retry %d", i)
		require.Contains(t, problemOf(t, r), "this request is waiting for an operator", "retry %d", i)
		require.Empty(t, r.header.Get(idemhttp.ReplayedHeader), "retry %d", i)
		if i == 0 {
			first = r
		}
		require.Equal(t, first.body, r.body, "retry %d: the same answer every time", i)
	}
	require.Zero(t, ran.Load(), "no step of the next release ran")
	require.EqualValues(t, 1, s.runs.Load(), "the charge was tried once, by the first attempt")
	var payments int
	require.NoError(t, s.db.QueryRow(context.Background(), `SELECT count(*) FROM payments`).Scan(&payments))
	require.Equal(t, 1, payments, "the insert ran once")
	rec, err := engine.Store().Load(context.Background(), recovery.Key{Tenant: "acme", ID: "k1"})
	require.NoError(t, err)
	require.Equal(t, recovery.StatusParked, rec.Status)
	require.Equal(t, "insert", rec.RecoveryPoint)
}
