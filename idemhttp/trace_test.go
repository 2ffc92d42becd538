package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// The workflow handler runs in the trace the request's traceparent names,
// unless a span in the request's context (an instrumented server's) is
// there already.
func TestWorkflowJoinsTheRequestsTrace(t *testing.T) {
	t.Parallel()
	db := dbtest.NewPool(t, 4)
	exporter := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	engine, err := workflow.NewEngine(db, workflow.Config{TracerProvider: provider})
	require.NoError(t, err)
	wf := workflow.Define("note",
		phase.Atomic("write", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Payment, Paid]) error {
			r.State.Row = r.Request.AmountCents
			return nil
		}),
	).Finish(func(s *Paid) workflow.Response { return workflow.JSON(http.StatusCreated, s) })
	h, err := idemhttp.Workflow(engine, wf, idemhttp.WorkflowConfig{Tenant: trustedTenant})
	require.NoError(t, err)
	instrumented := make(chan trace.SpanContext, 1) // the span the wrapping server made
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/instrumented" {
			ctx, span := provider.Tracer("server").Start(r.Context(), "server")
			defer span.End()
			instrumented <- span.SpanContext()
			r = r.WithContext(ctx)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	send := func(path, key string) trace.SpanContext {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{"amount_cents":5}`))
		require.NoError(t, err)
		req.Header = http.Header{"Idempotency-Key": {key}, "X-Tenant-Id": {"acme"}, "Content-Type": {"application/json"},
			"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		for _, s := range exporter.GetSpans() {
			if s.Name == "onceflow.attempt note" {
				exporter.Reset()
				return s.Parent
			}
		}
		t.Fatal("no attempt span")
		return trace.SpanContext{}
	}

	parent := send("/", "k1")
	require.True(t, parent.IsRemote())
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", parent.TraceID().String())
	require.Equal(t, "00f067aa0ba902b7", parent.SpanID().String())

	parent = send("/instrumented", "k2")
	server := <-instrumented
	require.Equal(t, server.TraceID(), parent.TraceID())
	require.Equal(t, server.SpanID(), parent.SpanID())
}

// Without an SDK (the engine's spans are no-ops), the record still stores
// the trace context of the request that created it, as its traceparent
// header named it: a later attempt of an instrumented process can link to
// it.
func TestWorkflowStoresTheCreatingRequestsTraceContext(t *testing.T) {
	t.Parallel()
	db := dbtest.NewPool(t, 4)
	engine, err := workflow.NewEngine(db, workflow.Config{})
	require.NoError(t, err)
	wf := workflow.Define("note",
		phase.Atomic("write", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Payment, Paid]) error { return nil }),
	).Finish(func(s *Paid) workflow.Response { return workflow.JSON(http.StatusCreated, s) })
	h, err := idemhttp.Workflow(engine, wf, idemhttp.WorkflowConfig{Tenant: trustedTenant})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	const traceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for i, header := range []string{traceParent, "00-11111111111111111111111111111111-2222222222222222-01"} {
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount_cents":5}`))
		require.NoError(t, err)
		req.Header = http.Header{"Idempotency-Key": {"k1"}, "X-Tenant-Id": {"acme"}, "Content-Type": {"application/json"},
			"Traceparent": {header}}
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusCreated, resp.StatusCode, "request %d", i)
	}
	rec, err := engine.Store().Load(context.Background(), workflow.Key{Tenant: "acme", ID: "k1"})
	require.NoError(t, err)
	require.Equal(t, traceParent, rec.TraceParent, "the first request's, which created the record; the replay changed nothing")
}

// TestMiddlewareStoresTheCreatingRequestsTraceContext: a key the middleware
// claims keeps the traceparent of the request that created its record, as
// a workflow's does; the replay changes nothing, and the handler runs in
// that trace.
func TestMiddlewareStoresTheCreatingRequestsTraceContext(t *testing.T) {
	s := newServer(t, idemhttp.Config{})
	var seen []string
	s.handle = func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, trace.SpanContextFromContext(r.Context()).TraceID().String())
		s.charge(w, r)
	}
	const traceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for i, header := range []string{traceParent, "00-11111111111111111111111111111111-2222222222222222-01"} {
		req, err := http.NewRequest(http.MethodPost, s.url+"/v1/charges", strings.NewReader(`{"amount":1}`))
		require.NoError(t, err)
		req.Header = http.Header{"Idempotency-Key": {"k1"}, "X-Tenant-Id": {"acme"}, "Content-Type": {"application/json"},
			"Traceparent": {header}}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusCreated, resp.StatusCode, "request %d", i)
	}
	var stored string
	require.NoError(t, s.db.QueryRow(context.Background(),
		`SELECT trace_parent FROM onceflow_keys WHERE tenant_id = 'acme' AND key = 'k1'`).Scan(&stored))
	require.Equal(t, traceParent, stored, "the first request's, which created the record")
	require.Equal(t, []string{"4bf92f3577b34da6a3ce929d0e0e4736"}, seen, "the handler ran once, in the creating request's trace")
}
