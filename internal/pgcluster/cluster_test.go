package pgcluster_test

import (
	"bufio"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/pgcluster"
)

func TestStartAndStop(t *testing.T) {
	ctx := context.Background()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: map[string]string{"application_name": "pgcluster_test"}})
	require.NoError(t, err)

	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	var fsync, appName string
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('application_name')`).Scan(&fsync, &appName))
	require.Equal(t, "off", fsync, "a throwaway cluster trades durability for speed")
	require.Equal(t, "pgcluster_test", appName, "extra settings reach the server")
	var dataDir string
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('data_directory')`).Scan(&dataDir))
	require.NoError(t, conn.Close(ctx))

	require.NoError(t, c.Stop())
	require.NoError(t, c.Stop(), "Stop is safe to call twice")
	_, err = os.Stat(dataDir)
	require.True(t, os.IsNotExist(err), "the cluster's directory is removed")
	_, err = pgx.Connect(ctx, c.URL())
	require.Error(t, err, "the server is gone")
}

// TestEnvReachesTheServer: Options.Env is in the server's environment,
// over this process's value of the same variable.
func TestEnvReachesTheServer(t *testing.T) {
	t.Setenv("ONCEFLOW_PGCLUSTER_ENV", "from the test process")
	ctx := context.Background()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Env: []string{"ONCEFLOW_PGCLUSTER_ENV=from Options.Env"}})
	require.NoError(t, err)
	defer c.Stop()

	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	// A program the server runs inherits the server's environment.
	_, err = conn.Exec(ctx, `CREATE TEMP TABLE env (v text);
		COPY env FROM PROGRAM 'printenv ONCEFLOW_PGCLUSTER_ENV'`)
	require.NoError(t, err)
	var got string
	require.NoError(t, conn.QueryRow(ctx, `SELECT v FROM env`).Scan(&got))
	require.Equal(t, "from Options.Env", got)
}

// TestHaltAndResume: a halted server refuses connections and ends its
// sessions; resumed, it is the same cluster at the same URL, with every
// committed row and none of the rolled-back ones.
func TestHaltAndResume(t *testing.T) {
	ctx := context.Background()
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	require.NoError(t, err)
	defer c.Stop()

	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	var started time.Time
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_postmaster_start_time()`).Scan(&started))
	_, err = conn.Exec(ctx, `CREATE TABLE kept (v text); INSERT INTO kept VALUES ('committed')`)
	require.NoError(t, err)
	open, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = open.Exec(ctx, `INSERT INTO kept VALUES ('uncommitted')`)
	require.NoError(t, err)

	require.NoError(t, c.Halt())
	require.NoError(t, c.Halt(), "halting a halted cluster does nothing")
	_, err = open.Exec(ctx, `SELECT 1`)
	require.Error(t, err, "the halt ended the session")
	_, err = pgx.Connect(ctx, c.URL())
	require.Error(t, err, "a halted server refuses connections")
	_, err = os.Stat(filepath.Join(c.Dir(), "data", "PG_VERSION"))
	require.NoError(t, err, "the data directory stays")

	require.NoError(t, c.Resume(ctx))
	require.NoError(t, c.Resume(ctx), "resuming a running cluster does nothing")
	conn, err = pgx.Connect(ctx, c.URL())
	require.NoError(t, err, "the same URL: port and password are kept")
	defer conn.Close(ctx)
	var restarted time.Time
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_postmaster_start_time()`).Scan(&restarted))
	require.True(t, restarted.After(started), "a new server process")
	rows, err := conn.Query(ctx, `SELECT v FROM kept`)
	require.NoError(t, err)
	kept, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"committed"}, kept, "committed rows kept, the open transaction rolled back")

	require.NoError(t, c.Halt())
	require.NoError(t, c.Stop(), "a halted cluster stops")
	_, err = os.Stat(c.Dir())
	require.True(t, os.IsNotExist(err), "the cluster's directory is removed")
	require.ErrorIs(t, c.Resume(ctx), pgcluster.ErrStopped)
	require.ErrorIs(t, c.Halt(), pgcluster.ErrStopped)
}

func TestFindBinariesPrefersNewestVersion(t *testing.T) {
	root := t.TempDir()
	for _, v := range []string{"9.6", "15", "17", "notaversion"} {
		bin := filepath.Join(root, v, "bin")
		require.NoError(t, os.MkdirAll(bin, 0o755))
		for _, name := range []string{"initdb", "postgres"} {
			require.NoError(t, os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"), 0o755))
		}
	}
	// Only the versioned root can answer: nothing on PATH, no pg_config.
	t.Setenv("PATH", t.TempDir())
	defer pgcluster.SetVersionedRoot(root)()

	dir, err := pgcluster.FindBinaries()
	require.NoError(t, err)
	require.Equal(t, filepath.Join(root, "17", "bin"), dir)
}

func TestNoServerSaysHowToGetOne(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	defer pgcluster.SetVersionedRoot(t.TempDir())()

	_, err := pgcluster.FindBinaries()
	require.ErrorIs(t, err, pgcluster.ErrNoServer)
	_, err = pgcluster.Start(context.Background(), pgcluster.Options{})
	require.ErrorIs(t, err, pgcluster.ErrNoServer)
	require.Contains(t, err.Error(), "ONCEFLOW_DATABASE_URL")
	require.Contains(t, err.Error(), "apt-get install postgresql")
}

func TestURLFromEnv(t *testing.T) {
	t.Setenv("ONCEFLOW_DATABASE_URL", "")
	t.Setenv("DATABASE_URL", "")
	require.Empty(t, pgcluster.URLFromEnv())
	t.Setenv("DATABASE_URL", "postgres://b")
	require.Empty(t, pgcluster.URLFromEnv(), "DATABASE_URL may name a developer's own database: never read it")
	t.Setenv("ONCEFLOW_DATABASE_URL", "postgres://a")
	require.Equal(t, "postgres://a", pgcluster.URLFromEnv())
}

// TestServerDiesWithItsOwner: when the process that started a cluster is
// killed before Stop, the server shuts down, and the next Start removes the
// directory it left.
func TestServerDiesWithItsOwner(t *testing.T) {
	if os.Getenv("PGCLUSTER_TEST_OWNER") == "1" {
		c, err := pgcluster.Start(context.Background(), pgcluster.Options{})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(c.Dir())
		select {} // wait to be killed
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestServerDiesWithItsOwner$")
	cmd.Env = append(os.Environ(), "PGCLUSTER_TEST_OWNER=1")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	dir := strings.TrimSpace(line)
	require.True(t, strings.HasPrefix(filepath.Base(dir), "onceflow-pg-"), "child said %q", line)
	pidFile, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	require.NoError(t, err)
	serverPID, err := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
	require.NoError(t, err)

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	require.Eventually(t, func() bool { return syscall.Kill(serverPID, 0) != nil },
		30*time.Second, 20*time.Millisecond, "the server outlived the process that started it")

	c, err := pgcluster.Start(context.Background(), pgcluster.Options{})
	require.NoError(t, err)
	defer c.Stop()
	_, err = os.Stat(dir)
	require.True(t, os.IsNotExist(err), "the dead owner's directory is removed")
}

func TestTCPNeedsThePassword(t *testing.T) {
	ctx := context.Background()
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	require.NoError(t, err)
	defer c.Stop()
	u, err := url.Parse(c.URL())
	require.NoError(t, err)
	u.User = url.User("postgres")
	_, err = pgx.Connect(ctx, u.String())
	require.Error(t, err, "no connection over TCP without the password")
}
