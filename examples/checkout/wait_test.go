package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
)

// TestPreferWaitEndsWithinTheWriteTimeout: a retry that prefers to wait
// for a key in flight (a dead server's, until its lease runs out) longer
// than the server's --write-timeout waits half of it at most, and is
// answered 409, not cut off with no answer.
//
// Mutation caught: serve leaving MaxWait at its default (10s), over the
// 3s write timeout: the connection is closed before the answer.
func TestPreferWaitEndsWithinTheWriteTimeout(t *testing.T) {
	e := newEnv(t)
	crashing := e.serve("--crash-after", "charge", "--lease", "30s")
	requireNoAnswer(t, mustRequest(t, crashing.URL, "k-1"))
	require.Equal(t, crashExitCode, crashing.Wait())

	app := e.serve("--write-timeout", "3s")
	req := mustRequest(t, app.URL, "k-1")
	req.Header.Set("Prefer", "wait=10")
	res := e.send(req)
	requireProblem(t, res, http.StatusConflict)
	require.Equal(t, "wait=1", res.header.Get(idemhttp.PreferenceAppliedHeader))
}

// TestMaxWaitWithin: the wait stays within half the write timeout, in
// whole seconds, and is off when that is under a second.
func TestMaxWaitWithin(t *testing.T) {
	for write, want := range map[string]string{
		"0s": "10s", "2m0s": "10s", "20s": "10s", "7s": "3s", "2s": "1s", "1.9s": "-1ns", "1ms": "-1ns",
	} {
		d, err := time.ParseDuration(write)
		require.NoError(t, err)
		require.Equal(t, want, maxWaitWithin(d).String(), write)
	}
}
