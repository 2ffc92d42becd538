package pgha

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// ensureSocketDirs makes the directories the server in bin puts its Unix
// sockets in by default, which pg_autoctl leaves as they are: a package
// install makes them, but they live under /run, which a fresh boot of a
// machine whose image already had the server may lack. Made as root, they
// belong to cred, the servers' user.
func ensureSocketDirs(bin string, cred *syscall.Credential) error {
	out, err := exec.Command(filepath.Join(bin, "postgres"), "--describe-config").Output()
	if err != nil {
		return fmt.Errorf("pgha: read the server's default settings: %w", err)
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		fields := strings.Split(line, "\t")
		if len(fields) < 5 || fields[0] != "unix_socket_directories" {
			continue
		}
		for dir := range strings.SplitSeq(fields[4], ",") {
			dir = strings.TrimSpace(dir)
			if dir == "" || !filepath.IsAbs(dir) {
				continue
			}
			if _, err := os.Stat(dir); err == nil {
				continue
			}
			if err := os.MkdirAll(dir, 0o2775); err != nil {
				return fmt.Errorf("pgha: make the servers' socket directory: %w", err)
			}
			if cred != nil {
				if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
					return fmt.Errorf("pgha: give the socket directory to the servers' user: %w", err)
				}
			}
		}
	}
	return nil
}
