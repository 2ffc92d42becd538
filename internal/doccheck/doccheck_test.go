package doccheck_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/doccheck"
)

// module is this module's path; the generated packages live under it.
const module = "github.com/onceflow/onceflow"

// TestDocumentsMatchTheCode holds README.md and docs/*.md to the code: a
// block marked as a file is that file byte for byte, and every Go block
// compiles, a fragment inside the harness its marker names.
func TestDocumentsMatchTheCode(t *testing.T) {
	root, err := doccheck.ModuleRoot()
	require.NoError(t, err)
	blocks := documentBlocks(t, root)
	require.NotEmpty(t, doccheck.Marked(blocks, "file examples/quickstart/main.go"),
		"README.md shows the quickstart, marked <!-- doccheck: file examples/quickstart/main.go -->")

	overlay := map[string]string{}
	var packages []string
	for _, b := range blocks {
		switch kind, arg, _ := strings.Cut(b.Marker, " "); {
		case kind == "file":
			want, err := os.ReadFile(filepath.Join(root, arg))
			require.NoError(t, err, b.Where())
			if line, differs := firstDifference(string(want), b.Text); differs {
				t.Errorf("%s claims to be %s but differs from it at its line %d", b.Where(), arg, line)
			}
		case b.Lang != "go" || kind == "curl":
		case kind == "harness" || kind == "":
			pkg := fmt.Sprintf("block%03d", len(packages)+1)
			src := []byte(b.Text)
			if kind == "harness" {
				src, err = doccheck.Wrap(b, arg, pkg)
				require.NoError(t, err)
			} else {
				require.True(t, strings.HasPrefix(strings.TrimSpace(b.Text), "package "),
					"%s: a Go block is a whole file, or says which harness wraps it (<!-- doccheck: harness %s -->)",
					b.Where(), strings.Join(doccheck.Harnesses, "|"))
			}
			file := filepath.Join(t.TempDir(), pkg+".go")
			require.NoError(t, os.WriteFile(file, src, 0o644))
			overlay[filepath.Join(root, "internal", "doccheck", "generated", pkg, "block.go")] = file
			packages = append(packages, module+"/internal/doccheck/generated/"+pkg)
		default:
			t.Fatalf("%s: unknown marker %q", b.Where(), b.Marker)
		}
	}
	require.NotEmpty(t, packages)
	compile(t, root, overlay, packages)
}

// documentBlocks reads every document's blocks, with paths relative to
// the module root, so that messages (and //line directives) name them so.
func documentBlocks(t *testing.T, root string) []doccheck.Block {
	t.Helper()
	docs, err := doccheck.Documents(root)
	require.NoError(t, err)
	require.Contains(t, docs, filepath.Join("docs", "guarantees.md"))
	var all []doccheck.Block
	for _, doc := range docs {
		blocks, err := doccheck.Read(filepath.Join(root, doc))
		require.NoError(t, err)
		for _, b := range blocks {
			b.Path = doc
			all = append(all, b)
		}
	}
	return all
}

// compile builds the generated packages, which exist only in the overlay,
// with go build.
func compile(t *testing.T, root string, files map[string]string, packages []string) {
	t.Helper()
	spec, err := json.Marshal(map[string]any{"Replace": files})
	require.NoError(t, err)
	overlay := filepath.Join(t.TempDir(), "overlay.json")
	require.NoError(t, os.WriteFile(overlay, spec, 0o644))
	cmd := exec.Command("go", append([]string{"build", "-overlay", overlay}, packages...)...)
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Run(), "the documents' Go blocks do not compile:\n%s", out.String())
}

// firstDifference returns the first line, from 1, where a and b differ.
func firstDifference(a, b string) (int, bool) {
	if a == b {
		return 0, false
	}
	al, bl := strings.SplitAfter(a, "\n"), strings.SplitAfter(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return i + 1, true
		}
	}
	return min(len(al), len(bl)) + 1, true
}
