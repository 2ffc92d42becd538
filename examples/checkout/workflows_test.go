package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// TestDeployCheck: the deploy check the docs give users, run as they
// would: onceflow workflows export from a database where this build's
// checkout ran, checkout workflows export from the build, and onceflow
// workflows diff between them. The same build passes (exit 0), in the
// shell's own <(...) form too; a checkout with a step inserted before
// charge fails it (exit 3), naming the recovery points that would park.
func TestDeployCheck(t *testing.T) {
	e := newEnv(t)
	app := e.serve()
	require.Equal(t, http.StatusCreated, e.checkout(app, "k-1", order).status)

	// run runs a command with the database in its environment, and returns
	// its standard output, then its standard error, and its exit code.
	run := func(bin string, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "ONCEFLOW_DATABASE_URL="+e.dbURL)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		return string(out) + stderr.String(), cmd.ProcessState.ExitCode()
	}
	dir := t.TempDir()
	write := func(name, body string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
		return path
	}

	// Every checkout finished: production needs no definition yet.
	prod, code := run(onceflowBinary, "workflows", "export")
	require.Zero(t, code, prod)
	require.Equal(t, "[]\n", prod)
	build, code := run(binary, "workflows", "export")
	require.Zero(t, code, build)
	var prodSpecs, buildSpecs []workflow.Spec
	require.NoError(t, json.Unmarshal([]byte(build), &buildSpecs))

	// A checkout this build left in flight (a claim with its definition, as
	// a process that died after claiming leaves one).
	pool := dbtest.Connect(t, e.dbURL, 0)
	store, err := recovery.New(pool, recovery.Config{})
	require.NoError(t, err)
	fp, canonical, err := recovery.FingerprintJSON("checkout", []byte(`{}`))
	require.NoError(t, err)
	_, _, err = store.Claim(context.Background(), recovery.ClaimParams{Key: recovery.Key{Tenant: "acme", ID: "in-flight"},
		Workflow: "checkout", Fingerprint: fp, Request: canonical, Definition: buildSpecs[0].Fingerprint})
	require.NoError(t, err)
	prod, code = run(onceflowBinary, "workflows", "export")
	require.Zero(t, code, prod)
	require.NoError(t, json.Unmarshal([]byte(prod), &prodSpecs))
	require.Equal(t, buildSpecs, prodSpecs, "the database holds the definition this build ran")
	require.Equal(t, []string{"create_order", "charge", "record_charge"}, stepNames(buildSpecs[0]))

	prev, cur := write("prev.json", prod), write("cur.json", build)
	out, code := run(onceflowBinary, "workflows", "diff", prev, cur)
	require.Zero(t, code, out)
	require.Contains(t, out, "nothing would park")
	script := `"$ONCEFLOW" workflows diff <("$ONCEFLOW" workflows export) <("$CHECKOUT" workflows export)`
	out, code = run("bash", "-c", "ONCEFLOW="+onceflowBinary+" CHECKOUT="+binary+" && "+script)
	require.Zero(t, code, out)
	require.Contains(t, out, "nothing would park")

	// The next release inserts fraud_check before charge.
	next := workflow.Define("checkout",
		phase.Atomic("create_order", func(context.Context, pgx.Tx, *phase.Run[CheckoutRequest, CheckoutState]) error { return nil }),
		foreign.Mutation("fraud_check", func(context.Context, *foreign.Call[CheckoutRequest, CheckoutState]) error { return nil }),
		foreign.Mutation("charge", func(context.Context, *foreign.Call[CheckoutRequest, CheckoutState]) error { return nil }),
		phase.Atomic("record_charge", func(context.Context, pgx.Tx, *phase.Run[CheckoutRequest, CheckoutState]) error { return nil }),
	).Version("2")
	body, err := json.Marshal([]workflow.Spec{next.Spec()})
	require.NoError(t, err)
	out, code = run(onceflowBinary, "workflows", "diff", prev, write("next.json", string(body)))
	require.Equal(t, 3, code, out)
	v1 := buildSpecs[0].Version
	require.Equal(t, "checkout "+v1+" after create_order: step 2 is charge (foreign) in version "+v1+", which may have started, but fraud_check (foreign) in version 2\n"+
		"checkout "+v1+" after charge: step 2 is charge (foreign) in version "+v1+", which completed, but fraud_check (foreign) in version 2\n"+
		"onceflow: records would park at 2 recovery points: in-flight records there would wait for an operator after this deploy\n", out)
}

func stepNames(s workflow.Spec) []string {
	names := make([]string, len(s.Steps))
	for i, st := range s.Steps {
		names[i] = st.Name
	}
	return names
}
