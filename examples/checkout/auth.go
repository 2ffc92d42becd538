package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// The checkout decides whose a request is before anything else looks at
// it: authenticated runs an authenticator, answers a refusal itself, and
// hands the tenant on in the request's context. The idempotency layer and
// the handlers read the tenant from there, never from a client's header.

// authenticator says whose a request is: its tenant, or an error that says
// why not (a *idemhttp.RequestError for a status other than 401).
type authenticator func(*http.Request) (string, error)

// minTokenLength keeps guessable API keys out of an --api-keys file.
const minTokenLength = 16

// apiKeys maps the SHA-256 of each API key to its tenant: a lookup by the
// hash reveals nothing about a key through its timing.
type apiKeys map[[sha256.Size]byte]string

// loadAPIKeys reads an --api-keys file: each non-empty line is "TOKEN
// TENANT".
func loadAPIKeys(path string) (apiKeys, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--api-keys: %w", err)
	}
	defer f.Close()
	keys := apiKeys{}
	lines := bufio.NewScanner(f)
	for n := 1; lines.Scan(); n++ {
		fields := strings.Fields(lines.Text())
		if len(fields) == 0 {
			continue
		}
		if err := keys.add(fields); err != nil {
			return nil, fmt.Errorf("--api-keys %s, line %d: %w", path, n, err)
		}
	}
	if err := lines.Err(); err != nil {
		return nil, fmt.Errorf("--api-keys %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("--api-keys %s: no keys: each line is TOKEN TENANT", path)
	}
	return keys, nil
}

func (k apiKeys) add(fields []string) error {
	if len(fields) != 2 {
		return errors.New("want TOKEN TENANT")
	}
	token, tenant := fields[0], fields[1]
	if len(token) < minTokenLength || !isToken68(token) {
		return fmt.Errorf("a token is at least %d characters of A-Z a-z 0-9 - . _ ~ + /", minTokenLength)
	}
	if err := recovery.CheckName("tenant", tenant); err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(token))
	if _, dup := k[sum]; dup {
		return errors.New("the token is listed twice")
	}
	k[sum] = tenant
	return nil
}

// newAPIKey makes a random API key.
func newAPIKey() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return "ck_" + hex.EncodeToString(b)
}

// bearer is the authenticator of `serve --api-keys`: the tenant is the one
// the request's bearer token belongs to, whatever other headers say.
func (k apiKeys) bearer(r *http.Request) (string, error) {
	values := r.Header.Values("Authorization")
	if len(values) == 0 {
		return "", errors.New("no credentials: send Authorization: Bearer <API key>")
	}
	if len(values) > 1 {
		return "", &idemhttp.RequestError{Status: http.StatusBadRequest, Detail: "more than one Authorization header"}
	}
	scheme, token, _ := strings.Cut(values[0], " ")
	token = strings.TrimLeft(token, " ")
	if tenant, ok := k[sha256.Sum256([]byte(token))]; ok && strings.EqualFold(scheme, "Bearer") {
		return tenant, nil
	}
	return "", errors.New("the API key is not valid")
}

// isToken68 reports whether s is of RFC 6750's b64token form.
func isToken68(s string) bool {
	trimmed := strings.TrimRight(s, "=")
	if trimmed == "" {
		return false
	}
	for _, c := range []byte(trimmed) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~+/", c) >= 0) {
			return false
		}
	}
	return true
}

// tenantHeader is the header `serve --trust-tenant-header` takes the tenant
// from.
const tenantHeader = "X-Tenant-ID"

// trustedTenantHeader is the authenticator of `serve --trust-tenant-header`,
// for a server behind a proxy that authenticates clients and sets the
// header: one value, not repeated, not a list (a proxy that appends its
// value to a client's yields two, which is refused, never resolved in the
// client's favour).
var trustedTenantHeader = idemhttp.TenantFromTrustedHeader(tenantHeader)

type tenantKey struct{}

// authenticated runs next for the requests auth accepts, with their tenant
// in the context, and answers the others: 401 with a Bearer challenge, or
// the status of a *idemhttp.RequestError, as problem details.
func authenticated(auth authenticator, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant, err := auth(r)
		if err != nil {
			var refused *idemhttp.RequestError
			if !errors.As(err, &refused) {
				refused = &idemhttp.RequestError{Status: http.StatusUnauthorized, Detail: err.Error()}
			}
			if refused.Status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="checkout"`)
			}
			writeProblem(w, workflow.Problem(refused.Status, refused.Detail))
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
	})
}

// authenticatedTenant is the tenant authenticated accepted the request for.
// It is an authenticator itself, for the layers behind authenticated.
func authenticatedTenant(r *http.Request) (string, error) {
	if tenant, ok := r.Context().Value(tenantKey{}).(string); ok {
		return tenant, nil
	}
	return "", errors.New("the request was not authenticated")
}
