package main_test

import (
	"bufio"
	"io"
	"net"
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

	cmd, base := startConsole(t, url, tokens)

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

// startConsole runs the sweeper serving the console to tokens on a free
// port, and returns it and the console's URL.
func startConsole(t *testing.T, url, tokens string) (*exec.Cmd, string) {
	t.Helper()
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
	select {
	case addr := <-addrs:
		return cmd, "http://" + addr
	case <-time.After(30 * time.Second):
		t.Fatal("the sweeper did not say where it serves the console")
	}
	return nil, ""
}

// TestSweeperConsoleCutsOffSlowRequests: a client that sends a request's
// headers and not all of its body, without a token, is answered and cut
// off within the server's read timeout (10s), not held for ever.
//
// Mutation caught: newServer without ReadTimeout (the server waits for
// the body it means to discard after its 401, and nothing comes back
// within the test's 30s).
func TestSweeperConsoleCutsOffSlowRequests(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	tokens := filepath.Join(t.TempDir(), "operators")
	require.NoError(t, os.WriteFile(tokens, []byte(operatorWrite+" write\n"), 0o600))
	_, base := startConsole(t, url, tokens)

	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "POST /api/bulk/release HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"Content-Length: 100\r\n\r\n{\"filter\":")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	_, err = io.ReadAll(conn) // the answer, then the end of the connection
	require.NoError(t, err, "the server answers and closes the connection well within 30s")
}
