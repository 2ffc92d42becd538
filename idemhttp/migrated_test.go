package idemhttp_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// TestNotMigrated: on a database nobody migrated, the middleware and the
// workflow handler answer 503 without running anything, and each logs one
// error that names the command to run, however many requests come.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	db := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true}), 4)
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil)) // Info and above: not Debug
	cfg := idemhttp.Config{Tenant: trustedTenant, Logger: logger}

	var ran atomic.Int32
	mw, err := idemhttp.Middleware(db, cfg)
	require.NoError(t, err)
	engine, err := workflow.NewEngine(db, workflow.Config{})
	require.NoError(t, err)
	wf := workflow.Define("pay", phase.Atomic("insert", func(context.Context, pgx.Tx, *phase.Run[Payment, Paid]) error {
		ran.Add(1)
		return nil
	})).Finish(func(s *Paid) workflow.Response { return workflow.JSON(http.StatusCreated, s) })
	wh, err := idemhttp.Workflow(engine, wf, idemhttp.WorkflowConfig{Tenant: cfg.Tenant, Logger: cfg.Logger})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran.Add(1) })))
	mux.Handle("POST /v1/payments", wh)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	s := &server{t: t, db: db, url: srv.URL}

	for _, path := range []string{"/v1/charges", "/v1/payments"} {
		for i := range 3 {
			r := s.post(path, "k"+string(rune('a'+i)), "acme", `{"amount_cents": 5}`)
			require.Equal(t, http.StatusServiceUnavailable, r.status, "%s: %s", path, r.body)
			require.Equal(t, "30", r.header.Get("Retry-After"))
			require.Contains(t, problemOf(t, r), "not set up")
		}
	}
	require.Zero(t, ran.Load(), "nothing runs without the key's protection")
	require.Equal(t, 2, strings.Count(logs.String(), "level=ERROR"), "one error per handler, not one per request:\n%s", logs.String())
	require.Equal(t, 2, strings.Count(logs.String(), "onceflow migrate up"), logs.String())
}
