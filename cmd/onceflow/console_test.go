package main_test

import (
	"bufio"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
)

const (
	operatorRead  = "reader-0123456789abcdefghij"
	operatorWrite = "writer-0123456789abcdefghij"
)

// TestSweeperServesTheConsole: --admin-addr serves the console and the
// admin API to the tokens of --admin-tokens and to nobody else; a browser
// is asked for a token.
//
// Mutations caught: the console served without Challenge (no
// WWW-Authenticate); the Authorize of the tokens file replaced by one
// that lets everyone read; --admin-addr accepted without --admin-tokens.
func TestSweeperServesTheConsole(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	tokens := filepath.Join(t.TempDir(), "operators")
	require.NoError(t, os.WriteFile(tokens, []byte(operatorRead+" read\n"+operatorWrite+" write\n"), 0o600))

	require.Contains(t, fails(t, 2, "sweeper", "--admin-addr", "127.0.0.1:0", "--database-url="+url),
		"--admin-addr needs --admin-tokens")
	short := filepath.Join(t.TempDir(), "short")
	require.NoError(t, os.WriteFile(short, []byte("guessable write\n"), 0o600))
	require.Contains(t, fails(t, 2, "sweeper", "--admin-addr", "127.0.0.1:0", "--admin-tokens", short, "--database-url="+url),
		"line 1: a token is at least 24 characters")

	cmd := exec.Command(binary, "sweeper", "--admin-addr", "127.0.0.1:0", "--admin-tokens", tokens, "--database-url="+url)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	addrs := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			if _, after, found := strings.Cut(lines.Text(), `msg="serving the admin console" addr=`); found {
				addrs <- after
			}
		}
	}()
	var base string
	select {
	case addr := <-addrs:
		base = "http://" + addr
	case <-time.After(30 * time.Second):
		t.Fatal("the sweeper did not say where it serves the console")
	}

	call := func(method, path, token string) answer {
		req, err := http.NewRequest(method, base+path, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		return answer{StatusCode: resp.StatusCode, Header: resp.Header}
	}
	resp := call(http.MethodGet, "/", "")
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Contains(t, resp.Header.Get("WWW-Authenticate"), "Basic")
	require.Equal(t, http.StatusUnauthorized, call(http.MethodGet, "/api/keys", "not-"+operatorRead).StatusCode)
	resp = call(http.MethodGet, "/", operatorRead)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Content-Type"), "text/html")
	require.Equal(t, http.StatusOK, call(http.MethodGet, "/api/keys", operatorRead).StatusCode)
	require.Equal(t, http.StatusForbidden, call(http.MethodPost, "/api/outbox/1/retry", operatorRead).StatusCode,
		"the read-only token may not act")
	require.Equal(t, http.StatusNotFound, call(http.MethodPost, "/api/outbox/1/retry", operatorWrite).StatusCode,
		"the read-write token may: there is no such message")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "a graceful stop exits 0")
	case <-time.After(20 * time.Second):
		t.Fatal("the sweeper did not stop on SIGTERM")
	}
}

// answer is what a request answered, but its body.
type answer struct {
	StatusCode int
	Header     http.Header
}
