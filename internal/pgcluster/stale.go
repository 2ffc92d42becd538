package pgcluster

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/onceflow/onceflow/internal/child"
)

// dirPrefix names every cluster directory in the temporary directory.
const dirPrefix = "onceflow-pg-"

// newClusterDir creates a private directory for a cluster and records this
// process as its owner.
func newClusterDir() (string, error) {
	dir, err := child.NewDir(dirPrefix, nil)
	if err != nil {
		return "", fmt.Errorf("cluster: %w", err)
	}
	return dir, nil
}

// removeStale deletes cluster directories whose owning process is gone: a
// test binary killed by a panic or a timeout never ran Stop. Its server got
// SIGQUIT when the owner died; a directory whose postmaster still runs is
// left alone until it is gone.
func removeStale(logger *slog.Logger) {
	postmaster := func(dir string) (int, bool) { return child.ReadPID(filepath.Join(dir, "data", "postmaster.pid")) }
	for dir, owner := range child.RemoveStale(dirPrefix, postmaster) {
		logger.Info("removed a throwaway PostgreSQL left by a dead process", slog.String("dir", dir), slog.Int("pid", owner))
	}
}
