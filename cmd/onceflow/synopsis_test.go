package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Markers around the synopsis in the docs; the block between them may be
// fenced (```text ... ```).
const (
	synopsisStart = "<!-- synopsis -->"
	synopsisEnd   = "<!-- /synopsis -->"
)

// TestSynopsisInTheDocs: every synopsis block in the Markdown files at the
// module's root and in docs/ is the one the command tree generates
// (onceflow docs synopsis), and there is at least one.
func TestSynopsisInTheDocs(t *testing.T) {
	t.Parallel()
	want := synopsis(newRoot(io.Discard, io.Discard))
	root := moduleRoot(t)
	var files []string
	for _, pattern := range []string{"*.md", "docs/*.md"} {
		matches, err := filepath.Glob(filepath.Join(root, pattern))
		require.NoError(t, err)
		files = append(files, matches...)
	}
	found := 0
	for _, file := range files {
		text, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, block := range synopsisBlocks(t, file, string(text)) {
			found++
			require.Equal(t, want, block, "the synopsis in %s is not the command tree's: replace it with the output of go run ./cmd/onceflow docs synopsis", file)
		}
	}
	require.NotZero(t, found, "no %s ... %s block in %v; put the output of go run ./cmd/onceflow docs synopsis in one:\n%s",
		synopsisStart, synopsisEnd, files, want)
}

// synopsisBlocks returns the text between each pair of markers in text,
// without the code fence around it.
func synopsisBlocks(t *testing.T, file, text string) []string {
	t.Helper()
	var blocks []string
	for {
		_, after, found := strings.Cut(text, synopsisStart)
		if !found {
			return blocks
		}
		block, rest, closed := strings.Cut(after, synopsisEnd)
		require.True(t, closed, "%s: %s without %s", file, synopsisStart, synopsisEnd)
		var lines []string
		for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
			if !strings.HasPrefix(line, "```") {
				lines = append(lines, line)
			}
		}
		blocks = append(blocks, strings.Join(lines, "\n")+"\n")
		text = rest
	}
}

// moduleRoot is the directory of go.mod above the test's directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "no go.mod above the test")
		dir = parent
	}
}

// TestSynopsisBlocks: the block reader takes fenced and bare blocks, and
// every pair in a file.
func TestSynopsisBlocks(t *testing.T) {
	t.Parallel()
	text := "intro\n" + synopsisStart + "\n```text\nonceflow a\nonceflow b\n```\n" + synopsisEnd + "\nmore\n" +
		synopsisStart + "\nonceflow c\n" + synopsisEnd + "\n"
	require.Equal(t, []string{"onceflow a\nonceflow b\n", "onceflow c\n"}, synopsisBlocks(t, "x.md", text))
}
