package child

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ownerFile, in a child's directory, holds the PID of the process that
// made the directory.
const ownerFile = "owner.pid"

// NewDir creates a private directory for a child in the temporary
// directory, its name starting with prefix, records this process as its
// owner, and hands it to cred's user when cred is not nil.
func NewDir(prefix string, cred *syscall.Credential) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", fmt.Errorf("create directory: %w", err)
	}
	err = os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644)
	if err == nil && cred != nil {
		err = os.Chown(dir, int(cred.Uid), int(cred.Gid))
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("create directory: %w", err)
	}
	return dir, nil
}

// RemoveStale deletes the directories NewDir made with prefix whose owner
// has died (a test binary killed by a panic or a timeout never cleans up)
// and whose server has exited too: serverPID, given a directory, returns
// the PID of the server that ran there, if it knows one. It returns the
// directories it removed, with their owners' PIDs.
func RemoveStale(prefix string, serverPID func(dir string) (int, bool)) map[string]int {
	removed := map[string]int{}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, dir := range dirs {
		owner, ok := ReadPID(filepath.Join(dir, ownerFile))
		if !ok || Alive(owner) {
			continue // not ours to judge, still being created, or in use
		}
		if pid, ok := serverPID(dir); ok && Alive(pid) {
			continue
		}
		if err := os.RemoveAll(dir); err == nil {
			removed[dir] = owner
		}
	}
	return removed
}

// ReadPID reads a PID from the first line of a file.
func ReadPID(path string) (int, bool) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	first, _, _ := strings.Cut(string(raw), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	return pid, err == nil
}

// Alive reports whether a process with this PID exists.
func Alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
