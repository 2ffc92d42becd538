package pgcluster_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

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
	require.Contains(t, err.Error(), "DATABASE_URL")
	require.Contains(t, err.Error(), "apt-get install postgresql")
}

func TestURLFromEnv(t *testing.T) {
	t.Setenv("ONCEFLOW_DATABASE_URL", "")
	t.Setenv("DATABASE_URL", "")
	require.Empty(t, pgcluster.URLFromEnv())
	t.Setenv("DATABASE_URL", "postgres://b")
	require.Equal(t, "postgres://b", pgcluster.URLFromEnv())
	t.Setenv("ONCEFLOW_DATABASE_URL", "postgres://a")
	require.Equal(t, "postgres://a", pgcluster.URLFromEnv(), "ONCEFLOW_DATABASE_URL wins")
}
