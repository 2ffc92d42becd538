package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// Trace a workflow with OpenTelemetry: give the engine a TracerProvider
// (here the SDK's, with an in-memory exporter; in production, one that
// exports to your collector). Each attempt gets a span in the caller's
// trace, with a span for the claim, each step and each try of a foreign
// call inside it; every later attempt at the key links to the first.
func ExampleConfig_tracerProvider() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("ONCEFLOW_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer db.Close()

	exporter := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter)) // WithBatcher(yourExporter) in production
	defer func() { _ = provider.Shutdown(ctx) }()
	engine, err := workflow.NewEngine(db, workflow.Config{TracerProvider: provider})
	if err != nil {
		panic(err)
	}

	providerDown := true
	reserve := workflow.Define("reserve",
		phase.Atomic("hold", func(ctx context.Context, tx pgx.Tx, r *phase.Run[CheckoutRequest, CheckoutState]) error {
			return nil
		}),
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[CheckoutRequest, CheckoutState]) error {
			// Make the call with ctx and foreign.SetHeader: the provider gets
			// the derived key and this call's traceparent.
			if providerDown {
				providerDown = false
				return errors.New("provider unavailable")
			}
			c.State.ChargeID = "ch_1"
			return nil
		}, foreign.Retry{Max: 2, Base: 1}),
	)

	// An instrumented HTTP server (otelhttp) starts a span per request; the
	// workflow handler of package idemhttp also reads an incoming
	// traceparent.
	key := workflow.Key{Tenant: "acme", ID: uuid.NewString()}
	for _, name := range []string{"POST /reserve", "POST /reserve (the client retries)"} {
		ctx, request := provider.Tracer("app").Start(ctx, name)
		if _, err := reserve.Run(ctx, engine, key, CheckoutRequest{Customer: "cus_1", AmountCents: 500}); err != nil {
			panic(err)
		}
		request.End()
	}
	// The retry is replayed in a trace of its own; its attempt links to
	// the attempt that created the record.
	printTree(exporter.GetSpans())
	// Output:
	// POST /reserve
	//   onceflow.attempt reserve
	//     onceflow.claim
	//     onceflow.step hold
	//     onceflow.step charge
	//       onceflow.call charge try=1 error
	//       onceflow.call charge try=2
	// POST /reserve (the client retries)
	//   onceflow.attempt reserve -> links to onceflow.attempt reserve in the trace of POST /reserve
	//     onceflow.claim
}

// printTree prints spans as a tree, children in the order they started, with the try
// of a call and whether it failed.
func printTree(spans tracetest.SpanStubs) {
	var walk func(parent string, depth int)
	walk = func(parent string, depth int) {
		var children []tracetest.SpanStub
		for _, s := range spans {
			if s.Parent.SpanID().String() == parent {
				children = append(children, s)
			}
		}
		slices.SortFunc(children, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
		for _, s := range children {
			line := strings.Repeat("  ", depth) + s.Name
			for _, kv := range s.Attributes {
				if kv.Key == "onceflow.try" {
					line += fmt.Sprintf(" try=%d", kv.Value.AsInt64())
				}
			}
			if s.Status.Code.String() == "Error" {
				line += " error"
			}
			for _, l := range s.Links {
				for _, o := range spans {
					if o.SpanContext.SpanID() == l.SpanContext.SpanID() {
						line += " -> links to " + o.Name + " in the trace of " + rootOf(spans, o).Name
					}
				}
			}
			fmt.Println(line)
			walk(s.SpanContext.SpanID().String(), depth+1)
		}
	}
	walk("0000000000000000", 0)
}

// rootOf is the span at the root of s's trace.
func rootOf(spans tracetest.SpanStubs, s tracetest.SpanStub) tracetest.SpanStub {
	for _, o := range spans {
		if o.SpanContext.SpanID() == s.Parent.SpanID() {
			return rootOf(spans, o)
		}
	}
	return s
}
