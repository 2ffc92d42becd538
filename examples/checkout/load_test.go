package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemclient"
)

// TestLoadCommand: checkout load, as a process, with serve's API key file,
// makes its checkouts and sums them up as JSON; the declined cards are
// final answers, not retried.
func TestLoadCommand(t *testing.T) {
	e := newEnv(t)
	app := e.serve()
	keys := filepath.Join(t.TempDir(), "api-keys")
	require.NoError(t, os.WriteFile(keys, []byte(apiKeyOf("acme")+" acme\n"), 0o600))
	out, err := exec.Command(binary, "load", "--url", app.URL, "--api-key-file", keys,
		"--intents", "20", "--concurrency", "4", "--declines", "0.1", "--json").Output()
	require.NoError(t, err, "%s", out)
	var report loadReport
	require.NoError(t, json.Unmarshal(out, &report), "%s", out)
	require.Equal(t, 20, report.Intents)
	require.Equal(t, 18, report.Succeeded)
	require.Equal(t, 2, report.Failed)
	require.Equal(t, map[int]int{201: 18, 402: 2}, report.Statuses)
	require.EqualValues(t, 20, report.Attempts, "nothing retried")
	require.Equal(t, 20, e.count(`SELECT count(*) FROM checkout_orders`))
	require.Len(t, e.charges(), 18)

	out, err = exec.Command(binary, "load", "--url", app.URL, "--intents", "0").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "--intents must be 1 to 100000")
}

// TestLoadInterrupted: a run whose context ends stops, and reports what it
// did: the intents in flight cancelled, the rest not started, no re-drive.
func TestLoadInterrupted(t *testing.T) {
	e := newEnv(t)
	app := e.serve()
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	report, err := runLoad(ctx, loadConfig{URL: app.URL, APIKey: apiKeyOf("acme"), Intents: 1000, Concurrency: 4, Redrive: true,
		Client: idemclient.Config{Hooks: idemclient.Hooks{Attempt: func(a idemclient.AttemptInfo) {
			if a.Status == 201 {
				cancel() // after the first checkout
			}
		}}}})
	require.NoError(t, err)
	require.True(t, report.Interrupted)
	require.Positive(t, report.Succeeded)
	require.Positive(t, report.NotStarted)
	require.Equal(t, report.Intents, report.Succeeded+report.Failed+report.GaveUp+report.NotStarted)
	require.Equal(t, report.GaveUp, report.GaveUpBy["canceled"], "%+v", report.GaveUpBy)
	require.Zero(t, report.Redrives, "a cancelled intent is not re-driven")
}
