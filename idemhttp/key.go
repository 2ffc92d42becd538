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

var errNoKey = errors.New("the Idempotency-Key header is missing")

// parseKey reads the Idempotency-Key header: a bare key of visible ASCII
// (no spaces, commas, semicolons, quotes or backslashes, which would make
// it ambiguous once proxies merge headers) or an RFC 8941 sf-string ("abc",
// with \" and \\ escapes), with parameters after it (;name or ;name=value,
// parsed by the grammar and ignored) and nothing else: a list of two items
// ("a";x, "b") is refused. The result is then held to the input rules of
// recovery.Key.
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
		key, rest, err := parseString(raw)
		if err != nil {
			return "", err
		}
		if err := parseParams(rest); err != nil {
			return "", fmt.Errorf("after the quoted Idempotency-Key: %w", err)
		}
		return key, nil
	}
	for i := 0; i < len(raw); i++ {
		if c := raw[i]; c <= ' ' || c > '~' || strings.IndexByte(`",;\`, c) >= 0 {
			return "", fmt.Errorf("an unquoted Idempotency-Key holds visible ASCII only, without spaces, commas, semicolons, quotes or backslashes (byte %d); quote it as an RFC 8941 string", i)
		}
	}
	return raw, nil
}

// parseString decodes the RFC 8941 sf-string at the start of raw:
// printable ASCII between double quotes, where only \" and \\ are escapes.
// It returns the string and what follows it.
func parseString(raw string) (value, rest string, err error) {
	var b strings.Builder
	for i := 1; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c == '"':
			return b.String(), raw[i+1:], nil
		case c == '\\':
			i++
			if i >= len(raw) || (raw[i] != '"' && raw[i] != '\\') {
				return "", "", errors.New(`a quoted string may escape only " and \`)
			}
			b.WriteByte(raw[i])
		case c < 0x20 || c > 0x7e:
			return "", "", fmt.Errorf("a quoted string holds printable ASCII only (byte %d)", i)
		default:
			b.WriteByte(c)
		}
	}
	return "", "", errors.New("a quoted string has no closing quote")
}

// TenantFromTrustedHeader returns a Config.Tenant that reads the named
// header, without the spaces and tabs around its value. Use it only behind
// a proxy that authenticates every request and sets the header itself,
// replacing whatever the client sent: the middleware cannot tell the
// proxy's value from a client's. A header sent more than once, or a value
// holding a comma (how proxies join a client's copy with their own), is
// 400; a missing or empty one is 401.
func TenantFromTrustedHeader(name string) func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		values := r.Header.Values(name)
		switch {
		case len(values) > 1:
			return "", &RequestError{Status: http.StatusBadRequest, Detail: fmt.Sprintf("the %s header is sent more than once", name)}
		case len(values) == 0 || trimOWS(values[0]) == "":
			return "", &RequestError{Status: http.StatusUnauthorized, Detail: fmt.Sprintf("the %s header is missing", name)}
		case strings.Contains(values[0], ","):
			return "", &RequestError{Status: http.StatusBadRequest, Detail: fmt.Sprintf("the %s header holds more than one value", name)}
		}
		return trimOWS(values[0]), nil
	}
}

// trimOWS cuts the spaces and tabs around a header value (RFC 9110, section
// 5.5), and nothing else: other white space is part of the value, and the
// input rules refuse it.
func trimOWS(value string) string { return strings.Trim(value, " \t") }

// caller is who a request is from: its record key and principal.
type caller struct {
	key       recovery.Key
	principal string
}

// identify builds the record key and the principal from the request, or
// the problem to answer.
func (h *core) identify(r *http.Request) (caller, *problem) {
	id, err := parseKey(r)
	if errors.Is(err, errNoKey) {
		return caller{}, &problem{status: http.StatusBadRequest, detail: err.Error(), noKey: true}
	}
	if err != nil {
		return caller{}, &problem{status: http.StatusBadRequest, detail: err.Error()}
	}
	// The key is held to its rules before the tenant is asked for: a bad key
	// is 400 with or without a tenant.
	var input *recovery.InputError
	if err := recovery.CheckName("key", id); errors.As(err, &input) {
		return caller{}, &problem{status: http.StatusBadRequest, detail: "Idempotency-Key " + input.Problem}
	}
	tenant, p := authenticated(h.tenant, r)
	if p != nil {
		return caller{}, p
	}
	key := recovery.Key{Tenant: tenant, ID: id}
	if err := key.Validate(); err != nil {
		return caller{}, &problem{status: http.StatusBadRequest, detail: err.Error()}
	}
	if h.principal == nil {
		return caller{key: key}, nil
	}
	principal, p := authenticated(h.principal, r)
	if p != nil {
		return caller{}, p
	}
	return caller{key: key, principal: principal}, nil
}

// authenticated asks fn (Config.Tenant or Config.Principal) about r. An
// error is 401, or what a *RequestError says; so is an empty answer.
func authenticated(fn func(*http.Request) (string, error), r *http.Request) (string, *problem) {
	value, err := fn(r)
	var reqErr *RequestError
	switch {
	case errors.As(err, &reqErr) && reqErr.Status >= 400 && reqErr.Status <= 599:
		return "", &problem{status: reqErr.Status, detail: reqErr.Detail}
	case err != nil || value == "":
		return "", &problem{status: http.StatusUnauthorized, detail: "the request is not authenticated"}
	}
	return value, nil
}
