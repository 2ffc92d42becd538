// Package tracing holds what onceflow's packages share to trace with
// OpenTelemetry: the span attribute keys, the propagator, and the
// traceparent a key record stores. It uses the OpenTelemetry API only:
// without an SDK configured, every span is a no-op.
package tracing

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName names the tracer of onceflow's spans (the instrumentation
// scope).
const ScopeName = "github.com/onceflow/onceflow"

// Span attributes. None carries request data: a derived key is a hash, and
// a record id a random uuid.
const (
	Workflow    = attribute.Key("onceflow.workflow")
	Tenant      = attribute.Key("onceflow.tenant")
	Key         = attribute.Key("onceflow.key")
	RecordID    = attribute.Key("onceflow.record_id")
	Attempt     = attribute.Key("onceflow.attempt")
	Outcome     = attribute.Key("onceflow.outcome") // how the claim found the key
	ResumedFrom = attribute.Key("onceflow.resumed_from")
	Status      = attribute.Key("onceflow.response.status")
	Result      = attribute.Key("onceflow.result") // completed, replayed, failed, compensated, rejected
	Step        = attribute.Key("onceflow.step")
	StepKind    = attribute.Key("onceflow.step.kind") // atomic or foreign
	DerivedKey  = attribute.Key("onceflow.derived_key")
	Compensates = attribute.Key("onceflow.compensates") // the derived key a compensation undoes
	Try         = attribute.Key("onceflow.try")
	// LinkKind names why a span links to another: "created" links an
	// attempt to the one that created its record.
	LinkKind = attribute.Key("onceflow.link")
)

// traceContext is the W3C Trace Context format a record's traceparent is
// stored in, whatever the propagator.
var traceContext = propagation.TraceContext{}

// Propagator is the propagator of trace context across HTTP: otel's global
// one (otel.SetTextMapPropagator), or W3C Trace Context when none was set
// (the global default propagates nothing).
func Propagator() propagation.TextMapPropagator {
	if p := otel.GetTextMapPropagator(); len(p.Fields()) > 0 {
		return p
	}
	return traceContext
}

// Inject writes ctx's trace context into h, as Propagator says.
func Inject(ctx context.Context, h http.Header) {
	Propagator().Inject(ctx, propagation.HeaderCarrier(h))
}

// Extract returns r's context with the trace context r's headers carry,
// unless the context already has a span (a server instrumented with
// otelhttp, say, made one from those headers): that one is kept.
func Extract(r *http.Request) context.Context {
	ctx := r.Context()
	if trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	return Propagator().Extract(ctx, propagation.HeaderCarrier(r.Header))
}

// TraceParent is sc as a W3C traceparent, "" when sc is not valid.
func TraceParent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	traceContext.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
	return carrier["traceparent"]
}

// Parse returns the span context a W3C traceparent names; it is not valid
// when s is empty or unreadable.
func Parse(s string) trace.SpanContext {
	if s == "" {
		return trace.SpanContext{}
	}
	ctx := traceContext.Extract(context.Background(), propagation.MapCarrier{"traceparent": s})
	return trace.SpanContextFromContext(ctx)
}

// End ends span, with err as its status when err is a failure.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
