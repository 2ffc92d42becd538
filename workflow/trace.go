package workflow

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/tracing"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
)

// The engine's spans (see Config.TracerProvider): an attempt's span is the
// parent of its claim's, its steps' and its compensations' spans; a
// foreign step's span is the parent of its calls' (package foreign).
const (
	spanAttempt    = "onceflow.attempt "
	spanClaim      = "onceflow.claim"
	spanStep       = "onceflow.step "
	spanCompensate = "onceflow.compensate "
)

// startAttempt starts the attempt's span, a child of the caller's span
// (in ctx) if any.
func (a *attempt[Req, State]) startAttempt(ctx context.Context) context.Context {
	ctx, a.span = a.e.tracer.Start(ctx, spanAttempt+a.w.name)
	if a.span.IsRecording() {
		a.span.SetAttributes(tracing.Workflow.String(a.w.name), tracing.Tenant.String(a.key.Tenant), tracing.Key.String(a.key.ID))
	}
	return ctx
}

// endAttempt ends the attempt's span with what it returned.
func (a *attempt[Req, State]) endAttempt(res *Result, err error) {
	if a.span.IsRecording() {
		if a.rec != nil {
			a.span.SetAttributes(tracing.RecordID.String(a.rec.ID.String()), tracing.Attempt.Int(a.run.Attempt))
		}
		if from := a.resumedFrom(); a.rec != nil && from != "" {
			a.span.SetAttributes(tracing.ResumedFrom.String(from))
		}
		if res != nil {
			a.span.SetAttributes(tracing.Result.String(resultName(res)), tracing.Status.Int(res.Response.Status))
		}
	}
	tracing.End(a.span, failure(err))
}

// resultName names how a run ended, for its span.
func resultName(res *Result) string {
	switch {
	case res.Replayed:
		return "replayed"
	case res.Compensated:
		return "compensated"
	case res.Failed:
		return "failed"
	case res.Rejected:
		return "rejected"
	}
	return "completed"
}

// failure is err unless it is a claim's outcome (the key in flight
// elsewhere, another request, another principal, parked): an answer, not
// a failure of the engine's, which a span does not mark as an error.
func failure(err error) error {
	if err == nil || (claimOutcome(0, err) != "" && !errors.As(err, new(*StepError))) {
		return nil
	}
	return err
}

// startClaim starts the claim's span.
func (a *attempt[Req, State]) startClaim(ctx context.Context) (context.Context, trace.Span) {
	return a.e.tracer.Start(ctx, spanClaim)
}

// endClaim ends the claim's span with the claim's outcome, and links the
// attempt's span to the span of the attempt that created rec, when it is
// not this one: a retry, a takeover, a completer's resume and a replay
// each show, in their own trace, where the key's life began.
func (a *attempt[Req, State]) endClaim(span trace.Span, rec *recovery.Record, outcome recovery.Outcome, err error) {
	if span.IsRecording() {
		if name := claimOutcome(outcome, err); name != "" {
			span.SetAttributes(tracing.Outcome.String(name))
			a.span.SetAttributes(tracing.Outcome.String(name))
		}
	}
	tracing.End(span, failure(err))
	if err == nil && outcome != recovery.OutcomeNew && a.span.IsRecording() {
		if origin := tracing.Parse(rec.TraceParent); origin.IsValid() {
			a.span.AddLink(trace.Link{SpanContext: origin, Attributes: []attribute.KeyValue{tracing.LinkKind.String("created")}})
		}
	}
}

// startStep starts the span of step, a child of the attempt's.
func (a *attempt[Req, State]) startStep(ctx context.Context, step phase.Step[Req, State]) (context.Context, trace.Span) {
	ctx, span := a.e.tracer.Start(ctx, spanStep+step.Name())
	if span.IsRecording() {
		span.SetAttributes(tracing.Step.String(step.Name()), tracing.StepKind.String(step.Kind().String()))
	}
	return ctx, span
}

// startCompensation starts the span of the compensation of step, a child
// of the attempt's, even when the failing step's span is in ctx (the step
// whose failure starts the compensations).
func (a *attempt[Req, State]) startCompensation(ctx context.Context, step string) (context.Context, trace.Span) {
	ctx, span := a.e.tracer.Start(trace.ContextWithSpan(ctx, a.span), spanCompensate+step)
	if span.IsRecording() {
		span.SetAttributes(tracing.Step.String(step))
	}
	return ctx, span
}

// traceParent is the traceparent a new record stores: the attempt's span,
// which a later attempt's span links to.
func (a *attempt[Req, State]) traceParent() string {
	return tracing.TraceParent(a.span.SpanContext())
}
