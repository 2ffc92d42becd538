package tracing_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/tracing"
)

// TestLibraryImportsTheAPIOnly: no package of onceflow but the examples
// imports the OpenTelemetry SDK (tests may): a program that does not
// install one pays for no-op spans only, and picks its own SDK version.
func TestLibraryImportsTheAPIOnly(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}", "github.com/onceflow/onceflow/...").Output()
	require.NoError(t, err)
	var library []string
	for _, pkg := range strings.Fields(string(out)) {
		if !strings.Contains(pkg, "/examples/") {
			library = append(library, pkg)
		}
	}
	require.Contains(t, library, "github.com/onceflow/onceflow/workflow")
	deps, err := exec.Command("go", append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, library...)...).Output()
	require.NoError(t, err)
	require.Contains(t, string(deps), "go.opentelemetry.io/otel/trace\n", "the library uses the API")
	for _, dep := range strings.Fields(string(deps)) {
		require.False(t, strings.HasPrefix(dep, "go.opentelemetry.io/otel/sdk"), "the library imports %s", dep)
	}
}

// A traceparent is stored and read back as the same span context; an
// empty or broken one is no span context.
func TestTraceParent(t *testing.T) {
	t.Parallel()
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	tp := tracing.TraceParent(sc)
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", tp)
	back := tracing.Parse(tp)
	require.Equal(t, sc.TraceID(), back.TraceID())
	require.Equal(t, sc.SpanID(), back.SpanID())
	require.True(t, back.IsRemote())
	require.Empty(t, tracing.TraceParent(trace.SpanContext{}))
	require.False(t, tracing.Parse("").IsValid())
	require.False(t, tracing.Parse("00-not-a-traceparent").IsValid())
}
