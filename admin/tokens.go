package admin

import (
	"bufio"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
)

// MinTokenLength is the shortest operator token Tokens accepts: shorter
// ones are guessable.
const MinTokenLength = 24

// MaxTokensBytes bounds a tokens file.
const MaxTokensBytes = 1 << 20

// Tokens is an authenticator for Config.Authorize: operators present a
// secret token, each with a role. A program sends it as a bearer token
// (Authorization: Bearer TOKEN); a browser as the password of HTTP Basic
// authentication (any user name), which it asks for when the console
// answers 401 with Challenge's header. Tokens are kept as their SHA-256,
// so that a lookup reveals nothing about a token through its timing.
type Tokens struct {
	roles map[[sha256.Size]byte]Role
}

// ErrNoToken is what Tokens.Authorize returns for a request without a
// token it knows (401).
var ErrNoToken = errors.New("no valid operator token: send Authorization: Bearer <token>, or sign in with the token as the password")

// LoadTokens reads a tokens file (ParseTokens).
func LoadTokens(path string) (*Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("operator tokens: %w", err)
	}
	defer f.Close()
	t, err := ParseTokens(io.LimitReader(f, MaxTokensBytes))
	if err != nil {
		return nil, fmt.Errorf("operator tokens %s: %w", path, err)
	}
	return t, nil
}

// ParseTokens reads tokens, one per line: "TOKEN ROLE", where ROLE is read
// or write. Empty lines and lines starting with # are skipped. A token is
// at least MinTokenLength characters without spaces; no token may be listed
// twice; and at least one must be.
func ParseTokens(r io.Reader) (*Tokens, error) {
	t := &Tokens{roles: map[[sha256.Size]byte]Role{}}
	lines := bufio.NewScanner(r)
	for n := 1; lines.Scan(); n++ {
		line := strings.TrimSpace(lines.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := t.add(strings.Fields(line)); err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrInvalidInput, n, err)
		}
	}
	if err := lines.Err(); err != nil {
		return nil, err
	}
	if len(t.roles) == 0 {
		return nil, fmt.Errorf("%w: no tokens: each line is TOKEN ROLE (read or write)", ErrInvalidInput)
	}
	return t, nil
}

func (t *Tokens) add(fields []string) error {
	if len(fields) != 2 {
		return errors.New("want TOKEN ROLE")
	}
	token, name := fields[0], fields[1]
	if len(token) < MinTokenLength {
		return fmt.Errorf("a token is at least %d characters", MinTokenLength)
	}
	var role Role
	switch name {
	case "read":
		role = RoleRead
	case "write":
		role = RoleWrite
	default:
		return fmt.Errorf("role %q is not read or write", name)
	}
	sum := sha256.Sum256([]byte(token))
	if _, dup := t.roles[sum]; dup {
		return errors.New("the token is listed twice")
	}
	t.roles[sum] = role
	return nil
}

// Authorize is a Config.Authorize: the role of the token the request
// presents, or ErrNoToken.
func (t *Tokens) Authorize(r *http.Request) (Role, error) {
	var token string
	if _, password, ok := r.BasicAuth(); ok {
		token = password
	} else if scheme, rest, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
		token = strings.TrimSpace(rest)
	}
	if len(r.Header.Values("Authorization")) == 1 && token != "" {
		if role, ok := t.roles[sha256.Sum256([]byte(token))]; ok {
			return role, nil
		}
	}
	return RoleNone, ErrNoToken
}

// Challenge sets, on the 401 answers of next, the header that makes a
// browser ask for credentials (WWW-Authenticate: Basic), so that an
// operator can open the console with a token as the password.
func Challenge(realm string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&challenger{ResponseWriter: w, realm: realm}, r)
	})
}

// challenger adds the challenge to a 401 as it is written.
type challenger struct {
	http.ResponseWriter
	realm string
}

func (c *challenger) WriteHeader(status int) {
	if status == http.StatusUnauthorized {
		c.Header().Set("WWW-Authenticate", fmt.Sprintf("Basic realm=%q, charset=\"UTF-8\"", c.realm))
	}
	c.ResponseWriter.WriteHeader(status)
}

// Unwrap lets http.ResponseController reach the writer underneath.
func (c *challenger) Unwrap() http.ResponseWriter { return c.ResponseWriter }
