package pgbouncer

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// dirPrefix names every bouncer directory in the temporary directory.
const dirPrefix = "onceflow-pgbouncer-"

// ownerFile holds the PID of the process that created a bouncer directory,
// pidFile the PID of its PgBouncer.
const (
	ownerFile = "owner.pid"
	pidFile   = "pgbouncer.pid"
)

// newDir creates a private directory for a bouncer, owned by the user
// PgBouncer runs as, and records this process as its owner.
func newDir(cred *syscall.Credential) (string, error) {
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return "", fmt.Errorf("pgbouncer: create directory: %w", err)
	}
	err = os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644)
	if err == nil && cred != nil {
		err = os.Chown(dir, int(cred.Uid), int(cred.Gid))
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("pgbouncer: create directory: %w", err)
	}
	return dir, nil
}

// removeStale deletes bouncer directories whose owning process is gone (a
// test binary killed by a panic or a timeout never ran Stop) once their
// PgBouncer, which got SIGTERM when the owner died, is gone too. They hold
// the server's password.
func removeStale(logger *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		owner, ok := readPID(filepath.Join(dir, ownerFile))
		if !ok || alive(owner) {
			continue // not ours to judge, still being created, or in use
		}
		if bouncer, ok := readPID(filepath.Join(dir, pidFile)); ok && alive(bouncer) {
			continue
		}
		if err := os.RemoveAll(dir); err == nil {
			logger.Info("removed a throwaway PgBouncer left by a dead process", slog.String("dir", dir), slog.Int("pid", owner))
		}
	}
}

func readPID(path string) (int, bool) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	return pid, err == nil
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
