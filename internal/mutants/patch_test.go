package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// root is the module's root, from this package's directory.
const root = "../.."

func TestEditAppliesOnlyToTextThatOccursOnce(t *testing.T) {
	e := Edit{File: "f.go", Old: "owner = $3", New: "true"}
	out, err := e.patch([]byte("WHERE key = $2 AND owner = $3"))
	require.NoError(t, err)
	require.Equal(t, "WHERE key = $2 AND true", string(out))

	for _, src := range []string{"WHERE key = $2", "owner = $3 OR owner = $3"} {
		_, err := e.patch([]byte(src))
		require.ErrorIs(t, err, ErrStale, "%q", src)
	}
	_, err = Edit{File: "f.go"}.patch([]byte("anything"))
	require.ErrorIs(t, err, ErrStale, "an empty old text matches everywhere")
}

func TestEditsOfOneFileApplyInOrder(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "q.sql"), []byte("a AND b AND c"), 0o644))
	m := Mutant{Name: "m", Edits: []Edit{{File: "q.sql", Old: "a AND ", New: ""}, {File: "q.sql", Old: "b AND c", New: "b"}}}
	files, err := m.applied(dir)
	require.NoError(t, err)
	require.Equal(t, map[string][]byte{"q.sql": []byte("b")}, files)
	m.Edits = append(m.Edits, Edit{File: "q.sql", Old: "a AND", New: ""})
	_, err = m.applied(dir)
	require.ErrorIs(t, err, ErrStale, "a later edit sees the earlier ones")
}

func TestVerdict(t *testing.T) {
	for _, c := range []struct {
		passed bool
		out    string
		want   Verdict
	}{
		{false, "--- FAIL: TestX (0.01s)\nFAIL\nFAIL\tpkg\t0.1s\n", Caught},
		{false, "panic: test timed out after 5m0s\n", Caught},
		{true, "ok  \tpkg\t0.1s\n", Survived},
		{false, "# pkg\n./a.go:1:1: undefined: x\nFAIL\tpkg [build failed]\n", Broken},
		{true, "ok  \tpkg\t0.1s [no tests to run]\n", Broken},
		{false, "dbtest: no PostgreSQL server\nFAIL\tpkg\t0.1s\n", Broken},
	} {
		require.Equal(t, c.want, verdict(c.passed, c.out), "%q", c.out)
	}
}

// TestMutantsApply: every mutant still applies to the module, so a change
// that makes one stale fails here, in the package's own tests, too.
func TestMutantsApply(t *testing.T) {
	require.NoError(t, check(mutants))
	require.NoError(t, applyAll(root, mutants))
	require.GreaterOrEqual(t, len(mutants), 12)
}

// TestMutantsNameTheirTests: each mutant's -run matches a test or fuzz
// target of its package.
func TestMutantsNameTheirTests(t *testing.T) {
	declared := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)\w+)\(`)
	for _, m := range mutants {
		files, err := filepath.Glob(filepath.Join(root, m.Pkg, "*_test.go"))
		require.NoError(t, err)
		run := regexp.MustCompile(m.Run)
		found := false
		for _, f := range files {
			src, err := os.ReadFile(f)
			require.NoError(t, err)
			for _, d := range declared.FindAllSubmatch(src, -1) {
				found = found || run.MatchString(string(d[1]))
			}
		}
		require.True(t, found, "%s: -run %q matches no test of %s", m.Name, m.Run, m.Pkg)
	}
}
