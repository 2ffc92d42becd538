package migrations

import (
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

//go:embed sql/*.sql
var files embed.FS

// Migration is one numbered schema change.
type Migration struct {
	// Version is the migration's number; versions start at 1 and have no gaps.
	Version int
	// Name is the file name's description, e.g. "keys".
	Name string

	up, down string
}

var fileName = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.(up|down)\.sql$`)

// all is parsed once from the embedded files.
var all = mustLoad(files)

// All returns the migrations this build knows, in order.
func All() []Migration { return slices.Clone(all) }

// Latest is the highest version this build knows.
func Latest() int { return all[len(all)-1].Version }

func mustLoad(fsys fs.FS) []Migration {
	m, err := load(fsys)
	if err != nil {
		panic(err)
	}
	return m
}

// load reads sql/NNNN_name.{up,down}.sql pairs and checks that versions run
// 1, 2, 3… with both directions present.
func load(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, "sql")
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		match := fileName.FindStringSubmatch(e.Name())
		if match == nil {
			return nil, fmt.Errorf("migration file %q is not named NNNN_name.up.sql or NNNN_name.down.sql", e.Name())
		}
		version, _ := strconv.Atoi(match[1])
		body, err := fs.ReadFile(fsys, "sql/"+e.Name())
		if err != nil {
			return nil, err
		}
		m := byVersion[version]
		if m == nil {
			m = &Migration{Version: version, Name: match[2]}
			byVersion[version] = m
		}
		if m.Name != match[2] {
			return nil, fmt.Errorf("migration %d has two names: %q and %q", version, m.Name, match[2])
		}
		if match[3] == "up" {
			m.up = string(body)
		} else {
			m.down = string(body)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for v := 1; v <= len(byVersion); v++ {
		m := byVersion[v]
		if m == nil {
			return nil, fmt.Errorf("migration %d is missing", v)
		}
		if strings.TrimSpace(m.up) == "" || strings.TrimSpace(m.down) == "" {
			return nil, fmt.Errorf("migration %d (%s) needs both an up and a down file", v, m.Name)
		}
		out = append(out, *m)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no migrations found")
	}
	return out, nil
}
