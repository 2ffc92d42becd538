package pgcluster

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

// dirPrefix names every cluster directory in the temporary directory.
const dirPrefix = "onceflow-pg-"

// ownerFile holds the PID of the process that created a cluster directory.
const ownerFile = "owner.pid"

// newClusterDir creates a private directory for a cluster and records this
// process as its owner.
func newClusterDir() (string, error) {
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return "", fmt.Errorf("create cluster directory: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("create cluster directory: %w", err)
	}
	return dir, nil
}

// removeStale deletes cluster directories whose owning process is gone: a
// test binary killed by a panic or a timeout never ran Stop. Its server got
// SIGQUIT when the owner died, so only files remain.
func removeStale(logger *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not ours to judge, or still being created
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil || alive(pid) || serverRunning(dir) {
			continue
		}
		if err := os.RemoveAll(dir); err == nil {
			logger.Info("removed a throwaway PostgreSQL left by a dead process", slog.String("dir", dir), slog.Int("pid", pid))
		}
	}
}

// serverRunning reports whether the cluster in dir still has a live
// postmaster, which leaves it alone until the server is gone.
func serverRunning(dir string) bool {
	raw, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		return false
	}
	first, _, _ := strings.Cut(string(raw), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	return err == nil && alive(pid)
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
