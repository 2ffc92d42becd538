package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/onceflow/onceflow/recovery"
)

// Header is the request header carrying the idempotency key.
const Header = "Idempotency-Key"

// ReplayedHeader marks a replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// TenantHeaderDefault is where the default tenant function looks.
const TenantHeaderDefault = "X-Tenant-ID"

var errNoKey = errors.New("the Idempotency-Key header is missing")

// parseKey reads the Idempotency-Key header: a bare key of visible ASCII
// (no spaces, commas, semicolons, quotes or backslashes, which would make
// it ambiguous once proxies merge headers) or an RFC 8941 sf-string ("abc",
// with \" and \\ escapes, parameters after it ignored). The result is then
// held to the input rules of recovery.Key.
func parseKey(r *http.Request) (string, error) {
	values := r.Header.Values(Header)
	if len(values) == 0 {
		return "", errNoKey
	}
	if len(values) > 1 {
		return "", errors.New("more than one Idempotency-Key header")
	}
	raw := trimOWS(values[0])
	if strings.HasPrefix(raw, `"`) {
		return parseString(raw)
	}
	for i := 0; i < len(raw); i++ {
		if c := raw[i]; c <= ' ' || c > '~' || strings.IndexByte(`",;\`, c) >= 0 {
			return "", fmt.Errorf("an unquoted Idempotency-Key holds visible ASCII only, without spaces, commas, semicolons, quotes or backslashes (byte %d); quote it as an RFC 8941 string", i)
		}
	}
	return raw, nil
}

// parseString decodes an RFC 8941 sf-string: printable ASCII between double
// quotes, where only \" and \\ are escapes, optionally followed by
// parameters (";name=value"), which are ignored.
func parseString(raw string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c == '"':
			if rest := raw[i+1:]; rest != "" && !strings.HasPrefix(rest, ";") {
				return "", errors.New("data after the quoted Idempotency-Key")
			}
			return b.String(), nil
		case c == '\\':
			i++
			if i >= len(raw) || (raw[i] != '"' && raw[i] != '\\') {
				return "", errors.New(`a quoted Idempotency-Key may escape only " and \`)
			}
			b.WriteByte(raw[i])
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("a quoted Idempotency-Key holds printable ASCII only (byte %d)", i)
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("the quoted Idempotency-Key has no closing quote")
}

// TenantFromHeader returns a tenant function that reads the named header,
// without the spaces and tabs around its value.
func TenantFromHeader(name string) func(*http.Request) string {
	return func(r *http.Request) string { return trimOWS(r.Header.Get(name)) }
}

// trimOWS cuts the spaces and tabs around a header value (RFC 9110, section
// 5.5), and nothing else: other white space is part of the value, and the
// input rules refuse it.
func trimOWS(value string) string { return strings.Trim(value, " \t") }

// key builds the record key from the request, or the problem to answer.
func (h *core) key(r *http.Request) (recovery.Key, *problem) {
	id, err := parseKey(r)
	if errors.Is(err, errNoKey) {
		return recovery.Key{}, &problem{status: http.StatusBadRequest, detail: err.Error(), noKey: true}
	}
	if err != nil {
		return recovery.Key{}, &problem{status: http.StatusBadRequest, detail: err.Error()}
	}
	// The key is held to its rules before the tenant is asked for: a bad key
	// is 400 with or without a tenant.
	var input *recovery.InputError
	if err := recovery.CheckName("key", id); errors.As(err, &input) {
		return recovery.Key{}, &problem{status: http.StatusBadRequest, detail: "Idempotency-Key " + input.Problem}
	}
	tenant := h.tenant(r)
	if tenant == "" {
		return recovery.Key{}, &problem{status: http.StatusUnauthorized, detail: "no tenant: the request does not say whose it is"}
	}
	key := recovery.Key{Tenant: tenant, ID: id}
	if err := key.Validate(); err != nil {
		return recovery.Key{}, &problem{status: http.StatusBadRequest, detail: err.Error()}
	}
	return key, nil
}
