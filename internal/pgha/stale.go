package pgha

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"syscall"

	"github.com/onceflow/onceflow/internal/child"
)

// dirPrefix names every formation directory in the temporary directory.
const dirPrefix = "onceflow-pgha-"

// newFormationDir creates a private directory for a formation, owned by
// the user its programs run as, and records this process as its owner.
func newFormationDir(cred *syscall.Credential) (string, error) {
	dir, err := child.NewDir(dirPrefix, cred)
	if err != nil {
		return "", fmt.Errorf("pgha: %w", err)
	}
	return dir, nil
}

// removeStale deletes formation directories whose owning process is gone
// (a test binary killed by a panic or a timeout never ran Stop) once no
// server of theirs runs: their keepers got SIGQUIT when the owner died and
// stop their servers.
func removeStale(logger *slog.Logger) {
	for dir, owner := range child.RemoveStale(dirPrefix, runningPostmaster) {
		logger.Info("removed a pg_auto_failover formation left by a dead process", slog.String("dir", dir), slog.Int("pid", owner))
	}
}

// runningPostmaster returns the PID of a postmaster of the formation in
// dir that still runs, if one does.
func runningPostmaster(dir string) (int, bool) {
	files, _ := filepath.Glob(filepath.Join(dir, "*", "postmaster.pid"))
	for _, file := range files {
		if pid, ok := child.ReadPID(file); ok && child.Alive(pid) {
			return pid, true
		}
	}
	return 0, false
}
