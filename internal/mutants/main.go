// Command mutants proves that the tests the Guarantees table (docs/guarantees.md) names
// can fail: it breaks each row's mechanism with a small patch (a mutant),
// runs the row's tests against the broken copy, and requires them to fail.
//
//	go run ./internal/mutants              # every mutant
//	go run ./internal/mutants -run fence   # the mutants whose names match
//	go run ./internal/mutants -list
//
// It copies the module's files (git ls-files, as they are in the working
// tree) to a temporary directory per worker, applies one mutant at a time
// there, runs go test -count=1 -run <the row's tests> <the row's package>,
// and puts the files back. A mutant is caught when a test fails; a mutant
// that does not build, or whose tests do not run, is broken, which proves
// nothing. Before running any, it checks that every mutant still applies:
// the text it replaces must occur exactly once, or the mutant is stale and
// the run fails at once.
//
// It prints a line per mutant and, last, "N mutants, M caught". It exits 1
// when a mutant survived or is broken, 2 when it could not run. With
// -baseline it runs the same tests on the unpatched module, a package at a
// time, and requires them to pass: a mutant caught by a test that fails
// anyway proves nothing.
//
// The tests share one throwaway PostgreSQL the command starts, unless
// ONCEFLOW_DATABASE_URL names a server.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/onceflow/onceflow/internal/child"
	"github.com/onceflow/onceflow/internal/pgcluster"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// testTimeout bounds one mutant's go test: a mutant that makes a test hang
// is caught by the timeout's panic.
const testTimeout = 5 * time.Minute

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mutants", flag.ContinueOnError)
	fs.SetOutput(stderr)
	only := fs.String("run", "", "run only the mutants whose names match this regexp")
	list := fs.Bool("list", false, "list the mutants and exit")
	jobs := fs.Int("j", 1, "mutants run at once")
	baseline := fs.Bool("baseline", false, "run the mutants' tests on the unpatched module instead: they must pass")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(stderr, "mutants:", err)
		return 2
	}
	selected, err := choose(mutants, *only)
	if err == nil {
		err = check(selected)
	}
	if err == nil {
		err = applyAll(root, selected)
	}
	if err != nil {
		fmt.Fprintln(stderr, "mutants:", err)
		return 2
	}
	if *list {
		for _, m := range selected {
			fmt.Fprintf(stdout, "%-32s %s -run '%s'\n    %s\n", m.Name, m.Pkg, m.Run, m.Breaks)
		}
		return 0
	}
	env, stop, err := databaseEnv()
	if err != nil {
		fmt.Fprintln(stderr, "mutants:", err)
		return 2
	}
	defer stop()
	if *baseline {
		selected = unpatched(selected)
	}
	caught, err := runAll(root, selected, max(*jobs, 1), env, stdout)
	if *baseline && err == nil {
		fmt.Fprintf(stdout, "%d packages, %d failed\n", len(selected), caught)
		if caught > 0 {
			return 1
		}
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "mutants:", err)
		return 2
	}
	fmt.Fprintf(stdout, "%d mutants, %d caught\n", len(selected), caught)
	if caught != len(selected) {
		return 1
	}
	return 0
}

// databaseEnv returns the environment of the tests: the database server
// the caller names (ONCEFLOW_DATABASE_URL), or else one
// throwaway cluster for all of them, which saves each test binary
// starting its own.
func databaseEnv() ([]string, func(), error) {
	if pgcluster.URLFromEnv() != "" {
		return os.Environ(), func() {}, nil
	}
	cluster, err := pgcluster.Start(context.Background(), pgcluster.Options{})
	if err != nil {
		return nil, nil, err
	}
	return append(os.Environ(), "ONCEFLOW_DATABASE_URL="+cluster.URL()), func() { _ = cluster.Stop() }, nil
}

// unpatched returns, per package of ms, a mutant with no edits that runs
// all of their tests.
func unpatched(ms []Mutant) []Mutant {
	var out []Mutant
	index := map[string]int{}
	for _, m := range ms {
		i, ok := index[m.Pkg]
		if !ok {
			index[m.Pkg] = len(out)
			out = append(out, Mutant{Name: "baseline " + m.Pkg, Breaks: "nothing", Pkg: m.Pkg, Run: m.Run, Env: m.Env})
			continue
		}
		out[i].Run += "|" + m.Run
		out[i].Env = append(out[i].Env, m.Env...)
	}
	return out
}

// choose returns the mutants whose names match pattern ("" matches all).
func choose(all []Mutant, pattern string) ([]Mutant, error) {
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, fmt.Errorf("-run: %w", err)
	}
	var out []Mutant
	for _, m := range all {
		if re.MatchString(m.Name) {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no mutant matches %q", pattern)
	}
	return out, nil
}

// applyAll checks that every mutant applies to the module at root.
func applyAll(root string, ms []Mutant) error {
	var errs []error
	for _, m := range ms {
		if _, err := m.applied(root); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("run it inside the onceflow module")
	}
	return filepath.Dir(gomod), nil
}

// runAll runs the mutants on jobs copies of the module and returns how many
// were caught.
func runAll(root string, ms []Mutant, jobs int, env []string, stdout io.Writer) (int, error) {
	files, err := trackedFiles(root)
	if err != nil {
		return 0, err
	}
	todo := make(chan Mutant)
	var (
		mu     sync.Mutex
		caught int
		errs   []error
		wg     sync.WaitGroup
	)
	for range min(jobs, len(ms)) {
		dir, err := os.MkdirTemp("", "onceflow-mutants-")
		if err != nil {
			return 0, err
		}
		defer os.RemoveAll(dir)
		if err := copyFiles(root, dir, files); err != nil {
			return 0, err
		}
		wg.Go(func() {
			for m := range todo {
				v, took, out, err := runOne(dir, m, env)
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", m.Name, err))
				}
				fmt.Fprintf(stdout, "%-8s %-32s %s -run '%s' (%s)\n", label(v, m), m.Name, m.Pkg, m.Run, took.Round(100*time.Millisecond))
				if v == Caught {
					caught++
				}
				if v != wanted(m) {
					fmt.Fprintf(stdout, "    %s\n    %s\n", m.Breaks, strings.ReplaceAll(child.LastLines(out, 20), "\n", "\n    "))
				}
				mu.Unlock()
			}
		})
	}
	for _, m := range ms {
		todo <- m
	}
	close(todo)
	wg.Wait()
	return caught, errors.Join(errs...)
}

// wanted is the verdict m must get: caught, or for the unpatched module
// (no edits) passing tests.
func wanted(m Mutant) Verdict {
	if len(m.Edits) == 0 {
		return Survived
	}
	return Caught
}

// label is how a line reports v.
func label(v Verdict, m Mutant) string {
	switch {
	case len(m.Edits) > 0:
		return v.String()
	case v == Survived:
		return "passed"
	case v == Caught:
		return "FAILED"
	}
	return v.String()
}

// runOne applies m to the copy in dir, runs its tests and restores the
// copy.
func runOne(dir string, m Mutant, env []string) (Verdict, time.Duration, []byte, error) {
	patched, err := m.applied(dir)
	if err != nil {
		return Broken, 0, nil, err
	}
	originals := map[string][]byte{}
	for path, src := range patched {
		full := filepath.Join(dir, path)
		if originals[path], err = os.ReadFile(full); err != nil {
			return Broken, 0, nil, err
		}
		if err := os.WriteFile(full, src, 0o644); err != nil {
			return Broken, 0, nil, err
		}
	}
	defer func() {
		for path, src := range originals {
			_ = os.WriteFile(filepath.Join(dir, path), src, 0o644)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout+time.Minute)
	defer cancel()
	started := time.Now()
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-vet=off", "-timeout", testTimeout.String(),
		"-run", m.Run, m.Pkg)
	cmd.Dir, cmd.Env = dir, slices.Concat(env, m.Env)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	runErr := cmd.Run()
	var exit *exec.ExitError
	if runErr != nil && !errors.As(runErr, &exit) {
		return Broken, time.Since(started), out.Bytes(), fmt.Errorf("go test: %w", runErr)
	}
	return verdict(runErr == nil, out.String()), time.Since(started), out.Bytes(), nil
}

// trackedFiles lists the module's files as git knows them, those present in
// the working tree.
func trackedFiles(root string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	var files []string
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if _, err := os.Lstat(filepath.Join(root, f)); err == nil {
			files = append(files, f)
		}
	}
	return files, nil
}

func copyFiles(from, to string, files []string) error {
	for _, f := range files {
		info, err := os.Lstat(filepath.Join(from, f))
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			continue
		}
		src, err := os.ReadFile(filepath.Join(from, f))
		if err != nil {
			return err
		}
		dst := filepath.Join(to, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, src, info.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}
