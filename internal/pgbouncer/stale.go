package pgbouncer

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"syscall"

	"github.com/onceflow/onceflow/internal/child"
)

// dirPrefix names every bouncer directory in the temporary directory.
const dirPrefix = "onceflow-pgbouncer-"

// pidFile, in a bouncer's directory, holds the PID of its PgBouncer.
const pidFile = "pgbouncer.pid"

// newDir creates a private directory for a bouncer, owned by the user
// PgBouncer runs as, and records this process as its owner.
func newDir(cred *syscall.Credential) (string, error) {
	dir, err := child.NewDir(dirPrefix, cred)
	if err != nil {
		return "", fmt.Errorf("pgbouncer: %w", err)
	}
	return dir, nil
}

// removeStale deletes bouncer directories whose owning process is gone (a
// test binary killed by a panic or a timeout never ran Stop) once their
// PgBouncer, which got SIGTERM when the owner died, is gone too. They hold
// the server's password.
func removeStale(logger *slog.Logger) {
	bouncer := func(dir string) (int, bool) { return child.ReadPID(filepath.Join(dir, pidFile)) }
	for dir, owner := range child.RemoveStale(dirPrefix, bouncer) {
		logger.Info("removed a throwaway PgBouncer left by a dead process", slog.String("dir", dir), slog.Int("pid", owner))
	}
}
