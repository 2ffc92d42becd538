package recovery

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"github.com/onceflow/onceflow/internal/canonjson"
)

// Fingerprint identifies a request: SHA-256 over its operation name and its
// body. A key reused with a different fingerprint is ErrMismatch.
type Fingerprint [sha256.Size]byte

// String returns the fingerprint in hex.
func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// MaxJSONDepth is how deeply arrays and objects may nest in a request that is
// fingerprinted.
const MaxJSONDepth = canonjson.MaxDepth

// ErrInvalidJSON reports a request that is not one well-formed JSON value;
// *JSONError says where.
var ErrInvalidJSON = canonjson.ErrInvalid

// JSONError is the ErrInvalidJSON that Canonicalize and FingerprintJSON
// return, with the byte offset of the problem.
type JSONError = canonjson.Error

// Domain tags keep a JSON fingerprint from ever equalling a bytes one.
const (
	jsonDomain  = "onceflow.fingerprint.json.v1"
	bytesDomain = "onceflow.fingerprint.bytes.v1"
)

// Canonicalize appends the canonical form of the JSON document src to dst.
// Two documents that mean the same value have the same canonical form: no
// insignificant whitespace, object keys sorted, numbers as the shortest
// exact decimal (1, 1.0 and 1e0 are all "1"; nothing is rounded), strings
// in one escaping. Duplicate object keys, invalid UTF-8 and nesting deeper
// than MaxJSONDepth are errors. Canonicalize is idempotent.
func Canonicalize(dst, src []byte) ([]byte, error) { return canonjson.Append(dst, src) }

// FingerprintJSON fingerprints a JSON request under an operation name (a
// workflow's name, or an HTTP method and route). The body is canonicalized
// first (see Canonicalize), so key order, whitespace, number spelling and
// string escaping do not change the result. It returns the canonical form
// too. Store the request as received (ClaimParams.Request), not in its
// canonical form: that writes an integer of more than 21 digits with an
// exponent, which a *big.Int, for one, does not read back.
//
// Key order does matter to encoding/json where two names of one object
// differ only in case ("amount", "AMOUNT"): decoding into a struct, it
// keeps the last. Fingerprint the body a handler decodes so byte for byte
// (FingerprintBytes), as idemhttp.Middleware does, or decode it with
// names matched exactly, as idemhttp.Workflow does.
func FingerprintJSON(operation string, body []byte) (Fingerprint, []byte, error) {
	canonical, err := canonjson.Append(make([]byte, 0, len(body)), body)
	if err != nil {
		return Fingerprint{}, nil, fmt.Errorf("fingerprint %s: %w", operation, err)
	}
	return digest(jsonDomain, operation, canonical), canonical, nil
}

// FingerprintBytes fingerprints a request body that is not JSON, byte for
// byte, under an operation name.
func FingerprintBytes(operation string, body []byte) Fingerprint {
	return digest(bytesDomain, operation, body)
}

// digest hashes the domain, the operation and the body, each length-prefixed
// so that no choice of operation and body can pose as another.
func digest(domain, operation string, body []byte) Fingerprint {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(domain), []byte(operation), body} {
		h.Write(binary.AppendUvarint(nil, uint64(len(part))))
		h.Write(part)
	}
	var f Fingerprint
	h.Sum(f[:0])
	return f
}
