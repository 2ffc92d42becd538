package systemtest

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/serveproc"
)

// binary is the checkout command of examples/checkout, built once for the
// tests: the app and the provider run as real processes.
var binary string

func TestMain(m *testing.M) { dbtest.MainWithBuild(m, "../examples/checkout", "checkout", &binary) }

// env is one test's database and payment provider process.
type env struct {
	t        *testing.T
	ctx      context.Context
	dbURL    string
	provider string
}

// tenant is the tenant the tests' checkouts belong to; apiKey is its key.
const (
	tenant = "acme"
	apiKey = "test-api-key-of-acme"
)

func newEnv(t *testing.T) *env {
	t.Helper()
	t.Parallel()
	e := &env{t: t, ctx: context.Background(), dbURL: dbtest.NewDatabase(t, dbtest.Options{})}
	cmd := exec.Command(binary, "provider", "--addr", "127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	e.provider = strings.TrimSpace(strings.TrimPrefix(line, "listening on "))
	return e
}

// authorize makes req the tenant's, by its API key.
func authorize(req *http.Request) { req.Header.Set("Authorization", "Bearer "+apiKey) }

// serve starts a checkout server process on the env's database and
// provider, authenticating the tenant by its API key, with args after the
// common ones (a later flag wins).
func (e *env) serve(args ...string) *serveProcess {
	e.t.Helper()
	file := filepath.Join(e.t.TempDir(), "api-keys")
	require.NoError(e.t, os.WriteFile(file, []byte(apiKey+" "+tenant+"\n"), 0o600))
	args = append([]string{"--database-url", e.dbURL, "--provider-url", e.provider, "--api-keys", file}, args...)
	p, err := startServe(e.ctx, binary, args...)
	require.NoError(e.t, err)
	e.t.Cleanup(func() {
		select {
		case <-p.Done():
		default:
			p.Stop()
		}
	})
	return p
}

// Charge is a charge the provider made, as its GET /charges lists it.
type Charge struct {
	ID             string `json:"id"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	AmountCents    int64  `json:"amount_cents"`
	Currency       string `json:"currency"`
}

func (e *env) charges() []Charge {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, e.provider+"/charges", nil)
	require.NoError(e.t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	var charges []Charge
	require.NoError(e.t, json.NewDecoder(resp.Body).Decode(&charges))
	return charges
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	conn, err := pgx.Connect(e.ctx, e.dbURL)
	require.NoError(e.t, err)
	defer conn.Close(e.ctx)
	var n int
	require.NoError(e.t, conn.QueryRow(e.ctx, sql, args...).Scan(&n))
	return n
}

const order = `{"customer_id":"cus_1","amount_cents":4200,"currency":"usd","card_token":"tok_visa","items":[{"sku":"book","qty":1}]}`

// serveProcess is `checkout serve` running as a child process.
type serveProcess = serveproc.Process

// startServe starts exe serve with args and waits until it listens.
var startServe = serveproc.Start
