package foreign

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/http"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/internal/tracing"
	"github.com/onceflow/onceflow/phase"
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

// KeySource is what downstream keys derive from besides the tenant, the
// client's key and the step: the choice of workflow.Config.DeriveKeysFrom.
type KeySource int

const (
	// FromRecord (the default) derives downstream keys from the key
	// record's id too, minted when the record is made. A key reused after
	// its record was pruned is a new execution with new downstream keys,
	// even where another system still remembers the old ones. But a record
	// lost with the database (an asynchronous standby promoted before it
	// received the record's commit) is made again with a new id on retry,
	// and its calls go out with new keys: a provider that honours keys
	// charges twice.
	FromRecord KeySource = iota
	// FromClientKey derives downstream keys from the tenant and the
	// client's key alone. A record lost in a failover is made again with
	// the same downstream keys, so a provider that honours keys answers
	// the second call with the first's result. But a key reused after its
	// record was pruned sends the old downstream keys again: a provider
	// that still remembers them answers with the old result instead of
	// acting. Choose it when keys are never reused (UUIDs per intent, as
	// idemclient makes) and the database may lose a commit in a failover.
	FromClientKey
)

// String returns "record" or "client-key".
func (s KeySource) String() string {
	switch s {
	case FromRecord:
		return "record"
	case FromClientKey:
		return "client-key"
	}
	return fmt.Sprintf("KeySource(%d)", int(s))
}

// ParseKeySource parses "record" or "client-key", as String writes them.
func ParseKeySource(text string) (KeySource, error) {
	for _, s := range []KeySource{FromRecord, FromClientKey} {
		if text == s.String() {
			return s, nil
		}
	}
	return 0, fmt.Errorf("%q is not a key source (record or client-key)", text)
}

// keyRecord is the record id r's downstream keys derive from: its own, or
// none when they derive from the client's key alone.
func keyRecord[Req, State any](r *phase.Run[Req, State]) uuid.UUID {
	if r.KeysFromClientKey {
		return uuid.Nil
	}
	return r.RecordID
}

// DeriveKey returns the downstream key for step of the record recordID under
// key, refined by parts (for one call among several in a step). The result
// is a hash: the same inputs always give the same key, and different inputs
// different keys. A zero recordID derives from the client's key alone
// (FromClientKey).
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
