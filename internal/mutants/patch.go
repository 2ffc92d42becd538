package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Mutant is one deliberate break of the mechanism a Guarantees row names,
// and the tests that must fail because of it.
type Mutant struct {
	// Name is how the Guarantees table (docs/guarantees.md) refers to the mutant.
	Name string
	// Breaks says what the patch does to the mechanism, in a line.
	Breaks string
	// Edits are applied together; each Old must occur exactly once in its
	// file.
	Edits []Edit
	// Pkg is the package whose tests run, as go test names it
	// ("./recovery").
	Pkg string
	// Run is the -run regexp of the tests the Guarantees row names.
	Run string
	// Env is added to the tests' environment (NAME=value): for a seeded
	// fault test, its long variant, which meets the broken path on every
	// seed where the short one meets it on most.
	Env []string
}

// Edit replaces Old with New in File, a path from the module's root.
type Edit struct {
	File     string
	Old, New string
}

// ErrStale reports an edit whose Old text does not occur exactly once: the
// code it breaks has changed, and the mutant must be brought up to date.
var ErrStale = errors.New("stale mutant")

// patch returns src with e applied, or ErrStale when e.Old does not occur
// exactly once in it.
func (e Edit) patch(src []byte) ([]byte, error) {
	if e.Old == "" {
		return nil, fmt.Errorf("%w: %s: an edit with no old text", ErrStale, e.File)
	}
	if n := bytes.Count(src, []byte(e.Old)); n != 1 {
		return nil, fmt.Errorf("%w: %s: the old text occurs %d times, not once: %q", ErrStale, e.File, n, firstLine(e.Old))
	}
	return bytes.Replace(src, []byte(e.Old), []byte(e.New), 1), nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

// applied returns the files of module root, by path, as m's edits leave
// them. Several edits of one file apply in order.
func (m Mutant) applied(root string) (map[string][]byte, error) {
	files := map[string][]byte{}
	for _, e := range m.Edits {
		src, ok := files[e.File]
		if !ok {
			var err error
			if src, err = os.ReadFile(filepath.Join(root, e.File)); err != nil {
				return nil, fmt.Errorf("%w: %s: %v", ErrStale, m.Name, err)
			}
		}
		out, err := e.patch(src)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.Name, err)
		}
		files[e.File] = out
	}
	return files, nil
}

// check reports what is wrong with the list of mutants itself: names that
// repeat or are missing, mutants without edits, tests or a valid regexp.
func check(mutants []Mutant) error {
	var errs []error
	seen := map[string]bool{}
	for _, m := range mutants {
		switch {
		case m.Name == "" || seen[m.Name]:
			errs = append(errs, fmt.Errorf("mutant %q: names must be unique and non-empty", m.Name))
		case len(m.Edits) == 0 || m.Pkg == "" || m.Run == "":
			errs = append(errs, fmt.Errorf("mutant %s: needs edits, a package and a -run regexp", m.Name))
		}
		if _, err := regexp.Compile(m.Run); err != nil {
			errs = append(errs, fmt.Errorf("mutant %s: -run: %w", m.Name, err))
		}
		seen[m.Name] = true
	}
	return errors.Join(errs...)
}

// Verdict is what running a mutant's tests showed.
type Verdict int

const (
	// Caught: a test failed.
	Caught Verdict = iota + 1
	// Survived: the tests passed with the mechanism broken.
	Survived
	// Broken: the mutant did not build, or no test ran, or the test
	// binary failed before any test did: it proves nothing.
	Broken
)

func (v Verdict) String() string {
	switch v {
	case Caught:
		return "caught"
	case Survived:
		return "SURVIVED"
	case Broken:
		return "BROKEN"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// verdict reads go test's result: passed is its exit status 0, out what
// it printed (stdout and stderr).
func verdict(passed bool, out string) Verdict {
	switch {
	case strings.Contains(out, "[build failed]") || strings.Contains(out, "[setup failed]"):
		return Broken
	case strings.Contains(out, "no tests to run"):
		return Broken
	case passed:
		return Survived
	case strings.Contains(out, "--- FAIL:") || strings.Contains("\n"+out, "\npanic: "):
		return Caught
	}
	return Broken // a failure outside any test: TestMain, the database
}
