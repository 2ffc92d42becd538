package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
)

// TestExplain runs the explain case on a throwaway server, few workflows,
// and checks the breakdown's structure and the figures that follow from
// the workloads' statements, never a speed.
func TestExplain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	report, err := Run(ctx, Config{Explain: true, Cases: []string{explainName}, NoFsync: true, ExplainWorkflows: 20})
	require.NoError(t, err)
	require.Len(t, report.Explain, len(workloads))
	for i, b := range report.Explain {
		require.Equal(t, workloads[i].name, b.Workload)
		require.Len(t, b.Sides, 4)
		for _, c := range b.Sides {
			require.Positive(t, c.WALBytes, "%s, %s", b.Workload, c.Side)
			require.InDelta(t, 2, c.Commits, 0.1, "%s, %s: two transactions per workflow", b.Workload, c.Side)
			require.Positive(t, c.RoundTrips, "%s, %s", b.Workload, c.Side)
			require.Positive(t, c.ServerTimeUS, "%s, %s", b.Workload, c.Side)
			require.Positive(t, c.ClientCPUUS, "%s, %s", b.Workload, c.Side)
			require.NotEmpty(t, b.Top[c.Side], "%s, %s", b.Workload, c.Side)
		}
		floor := b.side(sideFloor)
		for _, side := range []string{sideKeyRecord, sideWholeRecord, sideOnceflow} {
			keyed := b.side(side)
			require.InDelta(t, floor.RowsInserted+1, keyed.RowsInserted, 0.01, "%s: the key record is one insert more", side)
			require.InDelta(t, floor.RowsUpdated+1, keyed.RowsUpdated, 0.01, "%s: and one update more", side)
			require.Greater(t, keyed.WALBytes, floor.WALBytes, "%s: the bound is positive", side)
		}
	}
	var out strings.Builder
	require.NoError(t, report.WriteTable(&out))
	for _, row := range []string{"round trips", "commits", "WAL bytes", "server time", "server CPU", "rows inserted",
		"rows updated", "of which HOT", "client CPU", "WAL beyond the floor", "costliest statements, onceflow"} {
		n := 0
		for line := range strings.Lines(out.String()) {
			if strings.HasPrefix(strings.TrimSpace(line), row) {
				n++
			}
		}
		require.Equal(t, len(workloads), n, "a line %q per workload in:\n%s", row, out.String())
	}
	require.Contains(t, out.String(), "fsync off", "the header says the server is not durable")
	walFigures := 0
	for _, r := range report.Results {
		if strings.Contains(r.Figure, "WAL bytes per workflow beyond") {
			walFigures++
			require.Positive(t, r.Floor)
		}
	}
	require.Equal(t, 2*len(workloads), walFigures, "against the whole record and the least one")
}

// TestWorker runs a scale worker in this process over a delayed network
// and checks its protocol: ready, then one result per command.
func TestWorker(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	pool := dbtest.Connect(t, url, 1)
	_, err := pool.Exec(ctx, ordersTable+";"+shopSchema)
	require.NoError(t, err)
	in, commands := io.Pipe()
	replies, out := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- RunWorker(ctx, WorkerConfig{DatabaseURL: url, NetworkDelay: time.Millisecond, Concurrency: 2, ID: "t"}, in, out)
		_ = out.Close()
	}()
	lines := bufio.NewScanner(replies)
	require.True(t, lines.Scan())
	require.Equal(t, "ready", lines.Text())
	for _, side := range []string{"onceflow", "floor"} {
		_, err := io.WriteString(commands, side+" 200ms\n")
		require.NoError(t, err)
		require.True(t, lines.Scan())
		var res workerResult
		require.NoError(t, json.Unmarshal(lines.Bytes(), &res))
		require.Empty(t, res.Error)
		require.Positive(t, res.Ops, side)
		require.GreaterOrEqual(t, res.Seconds, 0.2)
	}
	var orders int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM bench_shop_orders WHERE status = 'paid'`).Scan(&orders))
	require.Positive(t, orders)
	require.NoError(t, commands.Close())
	require.NoError(t, <-done)
}
