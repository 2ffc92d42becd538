package workflow

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/url"
	"strings"
)

// KeyOf derives an idempotency key from business identity, for work whose
// intent outlives a process: KeyOf("acme", "order", "42", "capture") is
// the same key in every process, restarted or not, so a batch job that
// starts again from the top replays what it finished and resumes what it
// did not. The parts are joined with ':', each percent-escaped so that no
// two lists of parts give one key. Keys end up in logs: when a part holds
// personal data, use HashedKeyOf.
func KeyOf(tenant string, parts ...string) Key {
	escaped := make([]string, len(parts))
	for i, p := range parts {
		escaped[i] = strings.ReplaceAll(url.PathEscape(p), ":", "%3A")
	}
	return Key{Tenant: tenant, ID: strings.Join(escaped, ":")}
}

// HashedKeyOf is KeyOf for parts that must not appear in logs (an email
// address, a card number): the key is "h:" and a SHA-256 of the parts in
// hex.
func HashedKeyOf(tenant string, parts ...string) Key {
	h := sha256.New()
	for _, p := range parts {
		h.Write(binary.AppendUvarint(nil, uint64(len(p))))
		h.Write([]byte(p))
	}
	return Key{Tenant: tenant, ID: "h:" + hex.EncodeToString(h.Sum(nil))}
}
