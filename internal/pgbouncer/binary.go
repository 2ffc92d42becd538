package pgbouncer

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
)

// ErrNotInstalled reports that no pgbouncer executable was found. Its
// message says how to install one.
var ErrNotInstalled = errors.New("pgbouncer is not installed: install it (Debian/Ubuntu: apt-get install pgbouncer; " +
	"macOS: brew install pgbouncer) so that pgbouncer is on PATH or in /usr/sbin")

// sbinDirs are searched after PATH: Debian and Ubuntu install pgbouncer in
// /usr/sbin, which a normal user's PATH often lacks. A variable so that
// tests can point it elsewhere.
var sbinDirs = []string{"/usr/sbin", "/usr/local/sbin"}

// FindBinary returns the path of the pgbouncer executable: on PATH, or in
// /usr/sbin or /usr/local/sbin.
func FindBinary() (string, error) {
	if path, err := exec.LookPath("pgbouncer"); err == nil {
		return path, nil
	}
	for _, dir := range sbinDirs {
		path := filepath.Join(dir, "pgbouncer")
		if info, err := os.Stat(path); err == nil && !info.IsDir() && info.Mode()&0o111 != 0 {
			return path, nil
		}
	}
	return "", ErrNotInstalled
}
