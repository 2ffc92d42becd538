package admin_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/admin"
)

const (
	readToken  = "read-token-0123456789abcdef"
	writeToken = "write-token-0123456789abcdef"
)

// Mutations caught: a short token accepted; an unknown role read as
// read; a duplicate accepted; an empty file accepted.
func TestParseTokens(t *testing.T) {
	_, err := admin.ParseTokens(strings.NewReader("# operators\n\n" + readToken + " read\n" + writeToken + " write\n"))
	require.NoError(t, err)
	for name, file := range map[string]string{
		"short":     "short-token read\n",
		"role":      readToken + " admin\n",
		"fields":    readToken + "\n",
		"duplicate": readToken + " read\n" + readToken + " write\n",
		"empty":     "# nobody\n",
	} {
		_, err := admin.ParseTokens(strings.NewReader(file))
		require.ErrorIs(t, err, admin.ErrInvalidInput, name)
	}
}

// Mutations caught: Basic authentication's password not read (a browser
// cannot sign in); two Authorization headers resolved in the client's
// favour; an unknown token let in.
func TestTokensAuthorize(t *testing.T) {
	tokens, err := admin.ParseTokens(strings.NewReader(readToken + " read\n" + writeToken + " write\n"))
	require.NoError(t, err)
	req := func(header ...string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		for _, h := range header {
			r.Header.Add("Authorization", h)
		}
		return r
	}
	basic := req()
	basic.SetBasicAuth("oncall", writeToken)
	for name, c := range map[string]struct {
		r    *http.Request
		want admin.Role
	}{
		"bearer read":  {req("Bearer " + readToken), admin.RoleRead},
		"bearer write": {req("bearer " + writeToken), admin.RoleWrite},
		"basic":        {basic, admin.RoleWrite},
	} {
		role, err := tokens.Authorize(c.r)
		require.NoError(t, err, name)
		require.Equal(t, c.want, role, name)
	}
	for name, r := range map[string]*http.Request{
		"none":    req(),
		"unknown": req("Bearer " + strings.Repeat("x", 30)),
		"twice":   req("Bearer "+readToken, "Bearer "+writeToken),
		"scheme":  req("Token " + writeToken),
	} {
		role, err := tokens.Authorize(r)
		require.ErrorIs(t, err, admin.ErrNoToken, name)
		require.Equal(t, admin.RoleNone, role, name)
	}
}

// Mutation caught: Challenge not setting WWW-Authenticate on a 401 (a
// browser shows the problem instead of asking for the token), or setting
// it on every answer.
func TestChallenge(t *testing.T) {
	b := setup(t, admin.Config{})
	tokens, err := admin.ParseTokens(strings.NewReader(readToken + " read\n"))
	require.NoError(t, err)
	a, err := admin.New(b.db, admin.Config{Authorize: tokens.Authorize})
	require.NoError(t, err)
	srv := httptest.NewServer(admin.Challenge("onceflow", a.Handler()))
	t.Cleanup(srv.Close)

	resp, err := http.Get(srv.URL + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Equal(t, `Basic realm="onceflow", charset="UTF-8"`, resp.Header.Get("WWW-Authenticate"))

	r, err := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	require.NoError(t, err)
	r.SetBasicAuth("oncall", readToken)
	resp, err = http.DefaultClient.Do(r)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Empty(t, resp.Header.Get("WWW-Authenticate"))
}
