package workflow_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// traced is an engine whose spans end up in an in-memory exporter.
type traced struct {
	t        *testing.T
	exporter *tracetest.InMemoryExporter
	provider *sdktrace.TracerProvider
	engine   *workflow.Engine
}

func (w *world) traced(cfg workflow.Config) *traced {
	w.t.Helper()
	exporter := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	w.t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	cfg.TracerProvider = provider
	return &traced{t: w.t, exporter: exporter, provider: provider, engine: w.engine(cfg)}
}

// request starts a span as an instrumented server would for a request.
func (tr *traced) request(ctx context.Context) (context.Context, trace.Span) {
	return tr.provider.Tracer("test").Start(ctx, "POST /checkout")
}

// spans are the ended spans by name; a name ended twice fails the test.
func (tr *traced) spans() map[string]tracetest.SpanStub {
	tr.t.Helper()
	byName := map[string]tracetest.SpanStub{}
	for _, s := range tr.exporter.GetSpans() {
		_, twice := byName[s.Name]
		require.False(tr.t, twice, "span %s ended twice", s.Name)
		byName[s.Name] = s
	}
	return byName
}

func attr(s tracetest.SpanStub, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// requireChild checks that child's parent is parent, in parent's trace.
func requireChild(t *testing.T, parent, child tracetest.SpanStub) {
	t.Helper()
	require.Equal(t, parent.SpanContext.TraceID(), child.SpanContext.TraceID(), "%s is not in %s's trace", child.Name, parent.Name)
	require.Equal(t, parent.SpanContext.SpanID(), child.Parent.SpanID(), "%s is not a child of %s", child.Name, parent.Name)
}

// requireNoRequestData checks that no span attribute holds a value of the
// request's.
func requireNoRequestData(t *testing.T, spans map[string]tracetest.SpanStub, req Order) {
	t.Helper()
	for _, s := range spans {
		for _, kv := range s.Attributes {
			v := kv.Value.String()
			require.NotContains(t, v, req.Customer, "%s.%s", s.Name, kv.Key)
			require.NotContains(t, v, req.Card, "%s.%s", s.Name, kv.Key)
		}
	}
}

// A run makes one span per attempt, within the caller's trace, and in it
// one for the claim, one per step, and one per try of a foreign call with
// its derived key (no request data); the other system gets the call's
// trace context with the derived key.
func TestTraceOfARun(t *testing.T) {
	w := newWorld(t)
	tr := w.traced(workflow.Config{})
	ctx, req := tr.request(w.ctx)
	// A customer no record id, key or number can contain by chance (the
	// shared order's "c-1" is in about one random UUID in sixty).
	order := Order{Customer: "customer-traced", Amount: order.Amount, Card: order.Card}
	res, err := w.checkout().Run(ctx, tr.engine, acme, order)
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	req.End()

	spans := tr.spans()
	attempt := spans["onceflow.attempt checkout"]
	requireChild(t, spans["POST /checkout"], attempt)
	for _, name := range []string{"onceflow.claim", "onceflow.step create_order", "onceflow.step charge", "onceflow.step record_charge"} {
		requireChild(t, attempt, spans[name])
	}
	call := spans["onceflow.call charge"]
	requireChild(t, spans["onceflow.step charge"], call)
	rec := w.record(acme)
	chargeKey := foreign.DeriveKey(acme, rec.ID, "charge")
	require.Equal(t, chargeKey, attr(call, "onceflow.derived_key").AsString())
	require.Equal(t, int64(1), attr(call, "onceflow.try").AsInt64())
	require.Equal(t, "new", attr(attempt, "onceflow.outcome").AsString())
	require.Equal(t, "new", attr(spans["onceflow.claim"], "onceflow.outcome").AsString())
	require.Equal(t, rec.ID.String(), attr(attempt, "onceflow.record_id").AsString())
	require.Equal(t, "completed", attr(attempt, "onceflow.result").AsString())
	require.Equal(t, int64(201), attr(attempt, "onceflow.response.status").AsInt64())
	require.Equal(t, "atomic", attr(spans["onceflow.step create_order"], "onceflow.step.kind").AsString())
	require.Len(t, spans, 7)
	requireNoRequestData(t, spans, order)

	// The provider got the call's span as the parent of its own.
	parents := w.provider.TraceParents("charges")
	require.Len(t, parents, 1)
	require.Equal(t, "00-"+call.SpanContext.TraceID().String()+"-"+call.SpanContext.SpanID().String()+"-01", parents[0])
}

// A step's error marks its span, and the attempt's, as failed; a key in
// flight elsewhere is an answer, not a failure.
func TestTraceOfAFailedStep(t *testing.T) {
	w := newWorld(t)
	tr := w.traced(workflow.Config{})
	wf := w.checkout()
	w.before = func(_ context.Context, step string) error {
		if step == "charge" {
			return errors.New("the provider is down")
		}
		return nil
	}
	_, err := wf.Run(w.ctx, tr.engine, acme, order)
	require.Error(t, err)
	spans := tr.spans()
	require.Equal(t, codes.Error, spans["onceflow.step charge"].Status.Code)
	require.Equal(t, codes.Error, spans["onceflow.call charge"].Status.Code)
	require.Equal(t, codes.Error, spans["onceflow.attempt checkout"].Status.Code)
	require.Contains(t, spans["onceflow.attempt checkout"].Status.Description, "the provider is down")
	require.Equal(t, codes.Unset, spans["onceflow.step create_order"].Status.Code)

	// A duplicate while an attempt holds the key: the claim's outcome.
	tr.exporter.Reset()
	hold := make(chan struct{})
	entered := make(chan struct{})
	w.before = func(ctx context.Context, step string) error {
		if step == "charge" {
			close(entered)
			<-hold
		}
		return nil
	}
	other := workflow.Key{Tenant: "acme", ID: "order-2"}
	done := make(chan error, 1)
	go func() {
		_, err := wf.Run(w.ctx, tr.engine, other, order)
		done <- err
	}()
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("the first run ended before its charge: %v", err)
	}
	tr.exporter.Reset()
	_, err = wf.Run(w.ctx, tr.engine, other, order)
	require.ErrorIs(t, err, workflow.ErrInFlight)
	spans = tr.spans()
	require.Equal(t, "conflict", attr(spans["onceflow.claim"], "onceflow.outcome").AsString())
	require.Equal(t, codes.Unset, spans["onceflow.claim"].Status.Code)
	require.Equal(t, codes.Unset, spans["onceflow.attempt checkout"].Status.Code)
	close(hold)
	require.NoError(t, <-done)
}

// A compensation has a span of its own, and its call's span carries its
// own derived key and the key of the call it undoes.
func TestTraceOfACompensation(t *testing.T) {
	w := newWorld(t)
	tr := w.traced(workflow.Config{})
	wf := testapp.Checkout(w.provider.URL, testapp.Options{
		Before: func(_ context.Context, step string) error {
			if step == "record_charge" {
				return phase.Permanent(errors.New("the ledger refuses the entry"))
			}
			return nil
		},
		Charge: []foreign.Option{foreign.Compensate(testapp.Refund(w.provider.URL))},
	})
	res, err := wf.Run(w.ctx, tr.engine, acme, order)
	require.NoError(t, err)
	require.True(t, res.Compensated)

	var calls []string
	for _, s := range tr.exporter.GetSpans() {
		calls = append(calls, s.Name)
	}
	require.Contains(t, calls, "onceflow.compensate charge", strings.Join(calls, ", "))
	spans := map[string]tracetest.SpanStub{}
	for _, s := range tr.exporter.GetSpans() {
		if s.Name == "onceflow.call charge" && attr(s, "onceflow.compensates").AsString() != "" {
			spans["undo call"] = s
		} else {
			spans[s.Name] = s
		}
	}
	requireChild(t, spans["onceflow.attempt checkout"], spans["onceflow.compensate charge"])
	requireChild(t, spans["onceflow.compensate charge"], spans["undo call"])
	rec := w.record(acme)
	charge := foreign.DeriveKey(acme, rec.ID, "charge")
	require.Equal(t, charge, attr(spans["undo call"], "onceflow.compensates").AsString())
	require.Equal(t, foreign.DeriveKey(acme, rec.ID, "charge", "compensate"), attr(spans["undo call"], "onceflow.derived_key").AsString())
	require.Equal(t, "compensated", attr(spans["onceflow.attempt checkout"], "onceflow.result").AsString())
}

// Without a TracerProvider and without an SDK, nothing is traced, and a
// call carries no traceparent.
func TestNoTraceByDefault(t *testing.T) {
	w := newWorld(t)
	e := w.engine(workflow.Config{})
	_, err := w.checkout().Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Equal(t, []string{""}, w.provider.TraceParents("charges"))
	require.Empty(t, w.record(acme).TraceParent, "no trace context, none stored")
}
