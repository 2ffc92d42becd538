package foreign

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/internal/tracing"
	"github.com/onceflow/onceflow/recovery"
)

// KeyPrefix starts every derived key, so that one is recognisable in
// another system's logs.
const KeyPrefix = "of1_"

// KeyLength is the length of every derived key: the prefix and 64 hex
// digits, well within the 255 characters payment APIs accept.
const KeyLength = len(KeyPrefix) + 2*sha256.Size

// Header is the HTTP header that carries an idempotency key.
const Header = "Idempotency-Key"

// DeriveKey returns the downstream key for step of the record recordID under
// key, refined by parts (for one call among several in a step). The result
// is a hash: the same inputs always give the same key, and different inputs
// different keys.
func DeriveKey(key recovery.Key, recordID uuid.UUID, step string, parts ...string) string {
	h := sha256.New()
	write := func(s string) {
		// Length prefixes keep ("ab","c") and ("a","bc") apart.
		h.Write(binary.AppendUvarint(nil, uint64(len(s))))
		h.Write([]byte(s))
	}
	write("onceflow.foreign.v1")
	write(key.Tenant)
	write(key.ID)
	h.Write(recordID[:])
	write(step)
	for _, p := range parts {
		write(p)
	}
	return KeyPrefix + hex.EncodeToString(h.Sum(nil))
}

// SetHeader sets the Idempotency-Key header of an outgoing request to key,
// as a bare token (derived keys are valid RFC 8941 tokens, which is what
// most APIs expect), and writes the trace context of req's context into
// its headers (traceparent, with otel's global propagator, or W3C Trace
// Context when none is set), so that the other system's spans join the
// call's trace. Make req with the step's context
// (http.NewRequestWithContext): it carries the call's span.
func SetHeader(req *http.Request, key string) {
	req.Header.Set(Header, key)
	tracing.Inject(req.Context(), req.Header)
}
