package sweeper_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/onceflow/onceflow/sweeper"
	"github.com/onceflow/onceflow/workflow"
)

// TestCompleterResumeLinksToTheCreatingTrace: the completer's resume of a
// record whose process died starts a trace of its own, and its attempt's
// span links to the span of the attempt that created the record.
func TestCompleterResumeLinksToTheCreatingTrace(t *testing.T) {
	b := setup(t)
	exporter := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	crashing, err := workflow.NewEngine(b.db, workflow.Config{TracerProvider: provider, Hooks: &workflow.Hooks{
		CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
			if p == (workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"}) {
				return errors.New("died")
			}
			return nil
		},
	}})
	require.NoError(t, err)
	key := workflow.Key{Tenant: "acme", ID: "traced"}
	ctx, request := provider.Tracer("test").Start(b.ctx, "POST /checkout")
	_, err = b.checkout.Run(ctx, crashing, key, Order{Amount: 100})
	require.ErrorIs(t, err, workflow.ErrCrashed)
	request.End()
	require.NoError(t, crashing.Store().ExpireLease(b.ctx, key))
	var created tracetest.SpanStub
	for _, s := range exporter.GetSpans() {
		if s.Name == "onceflow.attempt checkout" {
			created = s
		}
	}
	require.True(t, created.SpanContext.IsValid())
	exporter.Reset()

	engine, err := workflow.NewEngine(b.db, workflow.Config{TracerProvider: provider, Workflows: []workflow.Definition{b.checkout}})
	require.NoError(t, err)
	completer, err := sweeper.NewCompleter(b.db, engine, sweeper.CompleterConfig{BackoffBase: -1})
	require.NoError(t, err)
	require.NoError(t, completer.Run(b.ctx))
	var resumed tracetest.SpanStub
	for _, s := range exporter.GetSpans() {
		if s.Name == "onceflow.attempt checkout" {
			resumed = s
		}
	}
	require.Contains(t, resumed.Attributes, attribute.String("onceflow.result", "completed"))
	require.NotEqual(t, created.SpanContext.TraceID(), resumed.SpanContext.TraceID(), "a trace of its own")
	require.Len(t, resumed.Links, 1)
	require.Equal(t, created.SpanContext.TraceID(), resumed.Links[0].SpanContext.TraceID())
	require.Equal(t, created.SpanContext.SpanID(), resumed.Links[0].SpanContext.SpanID())
}
