package workflow_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/tracing"
	"github.com/onceflow/onceflow/workflow"
)

// attempts are the ended attempt spans, in order.
func (tr *traced) attempts() []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range tr.exporter.GetSpans() {
		if s.Name == "onceflow.attempt checkout" {
			out = append(out, s)
		}
	}
	return out
}

// requireLinkedTo checks that s links to origin, as the attempt that
// created its record, and to nothing else.
func requireLinkedTo(t *testing.T, s tracetest.SpanStub, origin trace.SpanContext) {
	t.Helper()
	require.Len(t, s.Links, 1, "%s links", s.Name)
	require.Equal(t, origin.TraceID(), s.Links[0].SpanContext.TraceID())
	require.Equal(t, origin.SpanID(), s.Links[0].SpanContext.SpanID())
	require.Equal(t, "created", attr(tracetest.SpanStub{Attributes: s.Links[0].Attributes}, "onceflow.link").AsString())
}

// The record stores the trace context of the attempt that created it, and
// every later attempt at the key (a client's retry in a trace of its own,
// a takeover by Resume after a crash, a replay) links its span to it, so
// that one trace view leads from any of them to where the key began.
func TestTraceLinksEveryLaterAttemptToTheFirst(t *testing.T) {
	w := newWorld(t)
	tr := w.traced(workflow.Config{})
	wf := w.checkout()
	fail := map[string]error{"charge": errors.New("the provider is down")}
	w.before = func(_ context.Context, step string) error { return fail[step] }

	// The first request creates the record, and fails at the charge.
	ctx, req := tr.request(w.ctx)
	_, err := wf.Run(ctx, tr.engine, acme, order)
	require.Error(t, err)
	req.End()
	first := tr.attempts()[0]
	stored := w.record(acme).TraceParent
	require.Equal(t, tracing.TraceParent(first.SpanContext), stored, "the record stores the creating attempt's span")
	require.Empty(t, first.Links, "the first attempt links to nothing")

	// The client retries in a trace of its own; it fails at record_charge.
	fail = map[string]error{"record_charge": errors.New("the ledger is locked")}
	tr.exporter.Reset()
	ctx, req = tr.request(w.ctx)
	_, err = wf.Run(ctx, tr.engine, acme, order)
	require.Error(t, err)
	req.End()
	retry := tr.attempts()[0]
	require.NotEqual(t, first.SpanContext.TraceID(), retry.SpanContext.TraceID())
	requireLinkedTo(t, retry, first.SpanContext)
	require.Equal(t, "takeover", attr(retry, "onceflow.outcome").AsString())
	require.Equal(t, stored, w.record(acme).TraceParent, "a takeover does not change what the record stores")

	// Resume, as the completer does, with no trace of its own: a root span.
	fail = nil
	tr.exporter.Reset()
	res, err := tr.engine.Resume(w.ctx, acme)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	resumed := tr.attempts()[0]
	require.False(t, resumed.Parent.IsValid(), "a resume without a caller's trace starts its own")
	requireLinkedTo(t, resumed, first.SpanContext)
	require.Equal(t, "create_order", attr(resumed, "onceflow.resumed_from").AsString(), "the charge commits with record_charge")

	// A replay links too.
	tr.exporter.Reset()
	res, err = wf.Run(w.ctx, tr.engine, acme, order)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	replay := tr.attempts()[0]
	requireLinkedTo(t, replay, first.SpanContext)
	require.Equal(t, "replayed", attr(replay, "onceflow.result").AsString())
}
