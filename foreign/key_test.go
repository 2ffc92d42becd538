package foreign_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/recovery"
)

func TestDeriveKey(t *testing.T) {
	t.Parallel()
	key := recovery.Key{Tenant: "acme", ID: "order-1 for jane@example.com"}
	record := uuid.MustParse("6f1d0a3e-0c1b-4b6e-9a43-2f1e5d7c9b10")
	charge := foreign.DeriveKey(key, record, "charge")

	require.Equal(t, charge, foreign.DeriveKey(key, record, "charge"), "stable: every attempt derives the same key")
	require.Len(t, charge, foreign.KeyLength)
	require.LessOrEqual(t, len(charge), 255)
	require.True(t, strings.HasPrefix(charge, foreign.KeyPrefix))
	require.NotContains(t, charge, "jane", "no request data leaks downstream")

	different := []string{
		foreign.DeriveKey(recovery.Key{Tenant: "globex", ID: key.ID}, record, "charge"), // another tenant
		foreign.DeriveKey(key, uuid.New(), "charge"),                                    // the key reused after pruning
		foreign.DeriveKey(key, record, "refund"),                                        // another step
		foreign.DeriveKey(key, record, "charge", "item-1"),                              // a sub-call
		foreign.DeriveKey(key, record, "charge", "item-2"),
		foreign.DeriveKey(key, record, "charge", "item", "-1"), // parts do not run together
		foreign.DeriveKey(key, record, "charge", "item-", "1"),
	}
	seen := map[string]bool{charge: true}
	for i, k := range different {
		require.False(t, seen[k], "key %d collides", i)
		seen[k] = true
	}
}

func TestSetHeader(t *testing.T) {
	t.Parallel()
	req, err := http.NewRequest(http.MethodPost, "https://payments.example/charges", nil)
	require.NoError(t, err)
	foreign.SetHeader(req, "of1_abc")
	require.Equal(t, "of1_abc", req.Header.Get("Idempotency-Key"))
}

// SetHeader sends the trace context of the request's context, so that the
// other system's spans join the call's trace, and nothing without one.
func TestSetHeaderSendsTraceContext(t *testing.T) {
	t.Parallel()
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://payments.example/charges", nil)
	require.NoError(t, err)
	foreign.SetHeader(req, "of1_abc")
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", req.Header.Get("traceparent"))

	bare, err := http.NewRequest(http.MethodPost, "https://payments.example/charges", nil)
	require.NoError(t, err)
	foreign.SetHeader(bare, "of1_abc")
	require.Empty(t, bare.Header.Get("traceparent"))
}

// TestKeySourceText: each key source parses back from its text, which the
// flags and logs use; anything else is refused.
func TestKeySourceText(t *testing.T) {
	t.Parallel()
	for _, s := range []foreign.KeySource{foreign.FromRecord, foreign.FromClientKey} {
		parsed, err := foreign.ParseKeySource(s.String())
		require.NoError(t, err)
		require.Equal(t, s, parsed)
	}
	require.Equal(t, "record", foreign.FromRecord.String(), "the zero value, the default")
	_, err := foreign.ParseKeySource("")
	require.Error(t, err)
	_, err = foreign.ParseKeySource("KeySource(1)")
	require.Error(t, err)
}
