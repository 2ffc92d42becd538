package recovery

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// Fingerprint identifies a request: SHA-256 over its operation name and its
// body. A key reused with a different fingerprint is ErrMismatch.
type Fingerprint [sha256.Size]byte

// String returns the fingerprint in hex.
func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// Domain tags keep a JSON fingerprint from ever equalling a bytes one.
const (
	jsonDomain  = "onceflow.fingerprint.json.v1\x00"
	bytesDomain = "onceflow.fingerprint.bytes.v1\x00"
)

// FingerprintJSON fingerprints a JSON request under an operation name (a
// workflow's name, or an HTTP method and route). The body is canonicalized
// first (see Canonicalize), so key order, whitespace, number spelling and
// string escaping do not change the result. It returns the canonical form
// too, for storing.
func FingerprintJSON(operation string, body []byte) (Fingerprint, []byte, error) {
	canonical, err := Canonicalize(make([]byte, 0, len(body)), body)
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

func digest(domain, operation string, body []byte) Fingerprint {
	h := sha256.New()
	h.Write([]byte(domain))
	h.Write([]byte(operation))
	h.Write([]byte{0}) // operation names are printable, so this separates them
	h.Write(body)
	var f Fingerprint
	h.Sum(f[:0])
	return f
}
