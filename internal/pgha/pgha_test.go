package pgha_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/pgha"
)

// bound is each test's bound on one failover step: a promotion, a rejoin,
// a change of replication mode. The monitor acts within seconds.
const bound = time.Minute

// TestFormationFailover: the primary is killed with its whole node; the
// standby is promoted with every commit the primary acknowledged, the
// multi-host URL reaches it, and the old primary rejoins as its standby
// and replicates from it. Stop leaves no process and no file behind.
func TestFormationFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := start(t)
	first, err := f.Primary(ctx)
	require.NoError(t, err)
	other := otherNode(f, first)
	exec(t, f.URL(), `CREATE TABLE kept (v text)`, `INSERT INTO kept VALUES ('before')`)

	killed, err := f.KillPrimary(ctx, bound)
	require.NoError(t, err)
	require.Equal(t, first, killed)
	_, err = pgx.Connect(ctx, f.NodeURL(killed))
	require.Error(t, err, "the killed node is down")
	require.NoError(t, f.WaitPrimary(ctx, other, bound))
	require.Empty(t, processesIn(t, killed.Dir()+" "), "nothing restarted the killed node in place")
	require.ErrorIs(t, f.Kill(killed), pgha.ErrNodeDown)
	require.Equal(t, []string{"before"}, rows(t, f.URL()), "synchronous: the promoted standby has every acknowledged commit")
	exec(t, f.URL(), `INSERT INTO kept VALUES ('after')`)

	require.NoError(t, f.Rejoin(killed))
	require.ErrorIs(t, f.Rejoin(killed), pgha.ErrNodeRunning)
	require.NoError(t, f.WaitSecondary(ctx, killed, bound))
	standby := connect(t, f.NodeURL(killed))
	var recovering bool
	require.NoError(t, standby.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&recovering))
	require.True(t, recovering, "the old primary is a standby now")
	// The URL lists the old primary first: a new connection must skip it,
	// now a standby that refuses writes (target_session_attrs=read-write).
	require.Equal(t, first, f.Nodes()[0], "the first primary is the URL's first host")
	exec(t, f.URL(), `INSERT INTO kept VALUES ('after the rejoin')`)
	require.Eventually(t, func() bool { v, err := tryRows(f.NodeURL(killed)); return err == nil && len(v) == 3 }, bound, 50*time.Millisecond,
		"the old primary replicates the new one's commits")

	dir := f.Dir()
	require.NoError(t, f.Stop())
	require.NoError(t, f.Stop(), "Stop is safe to call twice")
	_, err = os.Stat(dir)
	require.True(t, os.IsNotExist(err), "the formation's directory is removed")
	require.Empty(t, processesIn(t, dir+"/"), "no process of the formation is left")
	require.ErrorIs(t, f.Rejoin(killed), pgha.ErrStopped)
}

// TestFormationAsyncLosesPausedCommits: with the standby asynchronous and
// the primary's WAL held back, a commit the primary acknowledged is lost
// when the primary dies: the monitor promotes the standby without it, and
// the old primary, rewound, rejoins without it too.
func TestFormationAsyncLosesPausedCommits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := start(t)
	require.NoError(t, f.SetAsync(ctx, bound))
	first, err := f.Primary(ctx)
	require.NoError(t, err)
	other := otherNode(f, first)
	exec(t, f.URL(), `CREATE TABLE kept (v text)`, `INSERT INTO kept VALUES ('replicated')`)
	require.Eventually(t, func() bool { v, err := tryRows(f.NodeURL(other)); return err == nil && len(v) == 1 }, bound, 50*time.Millisecond)

	resume, err := f.PauseReplication(ctx)
	require.NoError(t, err)
	defer resume()
	exec(t, f.URL(), `INSERT INTO kept VALUES ('primary only')`) // asynchronous: acknowledged at once
	require.Equal(t, []string{"primary only", "replicated"}, rows(t, f.URL()))
	_, err = f.KillPrimary(ctx, bound)
	require.NoError(t, err)

	require.NoError(t, f.WaitPrimary(ctx, other, bound))
	require.Equal(t, []string{"replicated"}, rows(t, f.URL()), "the acknowledged commit died with the primary")
	require.NoError(t, f.Rejoin(first))
	require.NoError(t, f.WaitSecondary(ctx, first, bound))
	require.Equal(t, []string{"replicated"}, rows(t, f.NodeURL(first)), "rewound, the old primary dropped it too")
	require.NoError(t, f.SetSync(ctx, bound))
}

func start(t *testing.T) *pgha.Formation {
	t.Helper()
	f, err := pgha.Start(context.Background(), pgha.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Stop() })
	return f
}

func otherNode(f *pgha.Formation, n *pgha.Node) *pgha.Node {
	for _, o := range f.Nodes() {
		if o != n {
			return o
		}
	}
	return nil
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func exec(t *testing.T, url string, statements ...string) {
	t.Helper()
	conn := connect(t, url)
	for _, s := range statements {
		_, err := conn.Exec(context.Background(), s)
		require.NoError(t, err, s)
	}
}

// rows returns the values in table kept, in order.
func rows(t *testing.T, url string) []string {
	t.Helper()
	values, err := tryRows(url)
	require.NoError(t, err)
	return values
}

// tryRows is rows for a condition polled until it holds: on a standby
// that has not replayed the table's creation yet, the query fails, and
// failing the test from the poll's goroutine would hide why.
func tryRows(url string) ([]string, error) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	r, err := conn.Query(ctx, `SELECT v FROM kept ORDER BY v`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(r, pgx.RowTo[string])
}

// processesIn lists the command lines of running processes that name
// path (or a path in it, for a directory that ends with a slash), their
// arguments joined by spaces.
func processesIn(t *testing.T, dir string) []string {
	t.Helper()
	cmdlines, err := filepath.Glob("/proc/[0-9]*/cmdline")
	require.NoError(t, err)
	var found []string
	for _, file := range cmdlines {
		raw, err := os.ReadFile(file)
		if err != nil {
			continue // exited meanwhile
		}
		if cmd := strings.ReplaceAll(string(raw), "\x00", " "); strings.Contains(cmd, dir) {
			found = append(found, cmd)
		}
	}
	return found
}
