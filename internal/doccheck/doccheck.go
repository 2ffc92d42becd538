// Package doccheck reads the fenced code blocks of onceflow's Markdown
// files, so that tests can hold the documentation to the code: a block that
// claims to be a file must be that file byte for byte, every Go block must
// compile, and command lines a reader pastes must work.
//
// A block says what it is with an HTML comment on the line right before its
// opening fence:
//
//	<!-- doccheck: file examples/quickstart/main.go -->   the block is this file
//	<!-- doccheck: harness http -->                        a fragment; the named harness wraps it
//	<!-- doccheck: curl examples/quickstart -->            command lines a test runs
//
// A Go block without a marker must be a whole file (it starts with package).
package doccheck

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// markerPrefix starts the HTML comment that marks a block.
const markerPrefix = "<!-- doccheck:"

// Block is a fenced code block of a Markdown file.
type Block struct {
	// Path is the Markdown file, as given to Read.
	Path string
	// Line is the line of the opening fence, from 1.
	Line int
	// Lang is the first word of the fence's info string ("go", "sh"), or "".
	Lang string
	// Marker is what the block's doccheck comment says ("file
	// examples/quickstart/main.go"), or "" when it has none.
	Marker string
	// Text is the block's lines, each ending in a newline.
	Text string
}

// Where says where the block is, as path:line.
func (b Block) Where() string { return fmt.Sprintf("%s:%d", b.Path, b.Line) }

// Read returns the fenced code blocks of the Markdown file at path. Fences
// are lines of three or more backquotes at the start of a line; a block
// left open is an error.
func Read(path string) ([]Block, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		blocks   []Block
		open     *Block
		fence    string
		previous string
	)
	lines := bufio.NewScanner(f)
	lines.Buffer(nil, 1<<20)
	for n := 1; lines.Scan(); n++ {
		line := lines.Text()
		switch {
		case open != nil && strings.TrimRight(line, " ") == fence:
			blocks = append(blocks, *open)
			open = nil
		case open != nil:
			open.Text += line + "\n"
		case strings.HasPrefix(line, "```"):
			fence = line[:len(line)-len(strings.TrimLeft(line, "`"))]
			info := strings.Fields(line[len(fence):])
			open = &Block{Path: path, Line: n, Marker: marker(previous)}
			if len(info) > 0 {
				open.Lang = info[0]
			}
		}
		previous = line
	}
	if err := lines.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if open != nil {
		return nil, fmt.Errorf("%s: the block opened at line %d is not closed", path, open.Line)
	}
	return blocks, nil
}

// marker is what a doccheck comment line says, or "".
func marker(line string) string {
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), markerPrefix)
	if !ok {
		return ""
	}
	rest, _ = strings.CutSuffix(rest, "-->")
	return strings.TrimSpace(rest)
}

// Marked returns the blocks whose marker is marker.
func Marked(blocks []Block, marker string) []Block {
	var marked []Block
	for _, b := range blocks {
		if b.Marker == marker {
			marked = append(marked, b)
		}
	}
	return marked
}

// ModuleRoot returns the directory of the go.mod that holds the working
// directory.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Documents returns the Markdown files that doccheck holds to the code,
// relative to the module root: README.md and docs/*.md.
func Documents(root string) ([]string, error) {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	files := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			return nil, err
		}
		files = append(files, rel)
	}
	return files, nil
}
