package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/doccheck"
)

var binary string

func TestMain(m *testing.M) { dbtest.MainWithCommand(m, "quickstart", &binary) }

// readmeAddr is the address the README's curl lines send to: the
// quickstart's default.
const readmeAddr = "localhost:8080"

// TestREADMECurlLines runs the quickstart as a process on a database that
// has never been migrated, as a reader would, and sends the README's three
// curl lines to it: the order is created, replayed byte for byte, and
// refused when the key comes back with another body.
func TestREADMECurlLines(t *testing.T) {
	url := dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true})
	addr, env := start(t, url)
	lines := readmeCurlLines(t)
	require.Len(t, lines, 3, "the README shows create, replay and mismatch")

	created := curl(t, lines[0], env, addr)
	require.Equal(t, http.StatusCreated, created.status, created.body)
	require.Regexp(t, `^\{"order_id":\d+,"charge_id":"ch_[0-9a-f]{8}_\d+"\}$`, created.body)
	require.Empty(t, created.header.Get("Idempotent-Replayed"))

	replayed := curl(t, lines[1], env, addr)
	require.Equal(t, http.StatusCreated, replayed.status, replayed.body)
	require.Equal(t, created.body, replayed.body, "a retry gets the stored bytes")
	require.Equal(t, "true", replayed.header.Get("Idempotent-Replayed"))

	mismatch := curl(t, lines[2], env, addr)
	require.Equal(t, http.StatusUnprocessableEntity, mismatch.status, mismatch.body)
	require.Equal(t, "application/problem+json", mismatch.header.Get("Content-Type"))

	db, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	defer db.Close(context.Background())
	var orders int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&orders))
	require.Equal(t, 1, orders)
}

// TestMiddlewareRoute: POST /v1/notes writes through idemhttp.Tx once per
// key, refuses a caller without the token, and replays to the one with it.
func TestMiddlewareRoute(t *testing.T) {
	url := dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true})
	addr, env := start(t, url)
	note := `curl -i -H "Authorization: Bearer $QUICKSTART_TOKEN" -H 'Idempotency-Key: note-1' -d 'buy milk' ` + readmeAddr + `/v1/notes`
	first := curl(t, note, env, addr)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	again := curl(t, note, env, addr)
	require.Equal(t, http.StatusCreated, again.status, again.body)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	stranger := curl(t, `curl -H 'Idempotency-Key: note-1' -d 'buy milk' `+readmeAddr+`/v1/notes`, env, addr)
	require.Equal(t, http.StatusUnauthorized, stranger.status, stranger.body)

	db, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	defer db.Close(context.Background())
	var notes int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM notes WHERE body = 'buy milk'`).Scan(&notes))
	require.Equal(t, 1, notes)
}

// start runs the quickstart on the database at url and returns the address
// it listens on and the environment its output tells a reader to export.
func start(t *testing.T, url string) (string, map[string]string) {
	t.Helper()
	cmd := exec.Command(binary)
	cmd.Env = append(os.Environ(), "ONCEFLOW_DATABASE_URL="+url, "ADDR=127.0.0.1:0", "QUICKSTART_TOKEN=")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	type started struct {
		addr string
		env  map[string]string
		err  error
	}
	ready := make(chan started, 1)
	go func() {
		env := map[string]string{}
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			line := lines.Text()
			if name, value, ok := strings.Cut(strings.TrimPrefix(line, "export "), "="); ok && strings.HasPrefix(line, "export ") {
				env[name] = value
			}
			if addr, ok := strings.CutPrefix(line, "listening on http://"); ok {
				ready <- started{addr: addr, env: env}
				_, _ = io.Copy(io.Discard, stdout)
				return
			}
		}
		ready <- started{err: fmt.Errorf("the quickstart exited before listening: %v", lines.Err())}
	}()
	select {
	case s := <-ready:
		require.NoError(t, s.err)
		require.NotEmpty(t, s.env["QUICKSTART_TOKEN"], "the quickstart prints the token to export")
		return s.addr, s.env
	case <-time.After(time.Minute):
		t.Fatal("the quickstart did not listen within a minute")
		return "", nil
	}
}

// readmeCurlLines returns the command lines of the README's block marked
// as the quickstart's curl lines.
func readmeCurlLines(t *testing.T) []string {
	t.Helper()
	root, err := doccheck.ModuleRoot()
	require.NoError(t, err)
	blocks, err := doccheck.Read(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	marked := doccheck.Marked(blocks, "curl examples/quickstart")
	require.Len(t, marked, 1, "README.md has one block marked <!-- doccheck: curl examples/quickstart -->")
	var lines []string
	for _, line := range strings.Split(marked[0].Text, "\n") {
		if strings.HasPrefix(line, "curl ") {
			lines = append(lines, line)
		}
	}
	return lines
}

type answer struct {
	status int
	header http.Header
	body   string
}

// curl does what the curl command line does, for the flags the README
// uses (-s, -i, -H, -d and a URL), with the README's address replaced by
// addr: the request a reader's curl sends, over real HTTP.
func curl(t *testing.T, line string, env map[string]string, addr string) answer {
	t.Helper()
	words, err := doccheck.Words(line, func(name string) string { return env[name] })
	require.NoError(t, err, line)
	require.Equal(t, "curl", words[0], line)
	var (
		url, body string
		hasBody   bool
		header    = http.Header{}
	)
	for i := 1; i < len(words); i++ {
		switch w := words[i]; w {
		case "-s", "-i", "-si", "-is":
		case "-H", "-d":
			require.Less(t, i+1, len(words), "%s needs a value: %s", w, line)
			i++
			if w == "-d" {
				body, hasBody = words[i], true
				continue
			}
			name, value, ok := strings.Cut(words[i], ":")
			require.True(t, ok, "a header is Name: value: %s", line)
			header.Add(name, strings.TrimSpace(value))
		default:
			require.False(t, strings.HasPrefix(w, "-"), "flag %s is not one the test knows: %s", w, line)
			require.Empty(t, url, "one URL per line: %s", line)
			url = w
		}
	}
	url, ok := strings.CutPrefix(url, readmeAddr)
	require.True(t, ok, "the README's lines go to %s: %s", readmeAddr, line)
	method, reader := http.MethodGet, io.Reader(nil)
	if hasBody {
		method, reader = http.MethodPost, strings.NewReader(body)
		header.Set("Content-Type", "application/x-www-form-urlencoded") // what curl -d sends
	}
	req, err := http.NewRequest(method, "http://"+addr+url, reader)
	require.NoError(t, err)
	req.Header = header
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(got)}
}
