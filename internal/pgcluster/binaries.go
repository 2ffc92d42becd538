package pgcluster

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrNoServer reports that neither a database URL nor PostgreSQL server
// binaries were found. Its message says how to get either.
var ErrNoServer = errors.New("no PostgreSQL available: set " + URLEnv + " " +
	"to a server where this user may CREATE DATABASE, or install the PostgreSQL server binaries " +
	"(Debian/Ubuntu: apt-get install postgresql; macOS: brew install postgresql) so that initdb and " +
	"postgres are on PATH, reachable through pg_config --bindir, or under /usr/lib/postgresql/*/bin")

// versionedRoot is where Debian and Ubuntu install one directory per server
// version. A variable so that tests can point it elsewhere.
var versionedRoot = "/usr/lib/postgresql"

// FindBinaries returns the directory holding the initdb and postgres
// executables. It looks on PATH, then at pg_config --bindir, then under
// /usr/lib/postgresql/*/bin, newest version first.
func FindBinaries() (string, error) { return FindBinariesWith(nil) }

// FindBinariesWith is FindBinaries for the first directory that accept
// also accepts (nil accepts every one): for a caller that needs a server
// with more than initdb and postgres, such as an extension installed for
// its version. It returns ErrNoServer when no directory qualifies.
func FindBinariesWith(accept func(bin string) bool) (string, error) {
	var candidates []string
	if initdb, err := exec.LookPath("initdb"); err == nil {
		candidates = append(candidates, filepath.Dir(initdb))
		// PATH often holds symlinks (for example /usr/local/bin/initdb); the
		// directory they point into has the matching postgres binary too.
		if real, err := filepath.EvalSymlinks(initdb); err == nil {
			candidates = append(candidates, filepath.Dir(real))
		}
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		candidates = append(candidates, strings.TrimSpace(string(out)))
	}
	candidates = append(candidates, versionDirs(versionedRoot)...)

	for _, dir := range candidates {
		if isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "postgres")) &&
			(accept == nil || accept(dir)) {
			return dir, nil
		}
	}
	return "", ErrNoServer
}

// versionDirs lists root/*/bin, highest major version first.
func versionDirs(root string) []string {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var versions []string
	for _, e := range entries {
		if e.IsDir() {
			versions = append(versions, e.Name())
		}
	}
	slices.SortFunc(versions, func(a, b string) int { return compareVersions(b, a) })
	dirs := make([]string, 0, len(versions))
	for _, v := range versions {
		dirs = append(dirs, filepath.Join(root, v, "bin"))
	}
	return dirs
}

// compareVersions orders "9.6" < "15" < "17" numerically, part by part.
func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(pa), len(pb)); i++ {
		na, nb := versionPart(pa, i), versionPart(pb, i)
		if na != nb {
			return na - nb
		}
	}
	return strings.Compare(a, b)
}

func versionPart(parts []string, i int) int {
	if i >= len(parts) {
		return 0
	}
	n, err := strconv.Atoi(parts[i])
	if err != nil {
		return -1
	}
	return n
}

func isExecutable(path string) bool {
	info, err := os.Stat(path)
	return err == nil && !info.IsDir() && info.Mode()&0o111 != 0
}

// URLEnv names the environment variable that gives onceflow's tests and
// command line a database URL. It is never the generic DATABASE_URL: a
// developer may have exported that for an application of their own, and
// the tests create and drop databases on the server it names.
const URLEnv = "ONCEFLOW_DATABASE_URL"

// URLFromEnv returns the database URL in URLEnv. Empty means none.
func URLFromEnv() string { return os.Getenv(URLEnv) }
