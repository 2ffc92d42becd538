package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/recovery"
)

var (
	// ErrVersionMismatch reports a VersionedUpdate of a row that exists
	// with another version: someone else wrote it since the version was
	// read. errors.Is(err, ErrPreconditionFailed) holds too, so
	// [WritePrecondition] answers it 412.
	ErrVersionMismatch = fmt.Errorf("%w: the row has another version", ErrPreconditionFailed)
	// ErrNotFound reports a VersionedUpdate of a row that does not exist.
	ErrNotFound = errors.New("no row with this id")
)

// VersionedUpdate sets the columns of set on the row of table whose id is
// id, if its version is still version, and adds one to its version: a
// compare-and-set. It returns the new version; ErrVersionMismatch when the
// row has another version, ErrNotFound when there is no row with the id.
//
// The table needs a column id (its key) and a column version bigint NOT
// NULL, which every writer of the row increments; version's value in
// [ETag] is the row's entity tag. It runs one statement,
//
//	UPDATE table SET col1 = $3, col2 = $4, version = version + 1
//	WHERE id = $1 AND version = $2 RETURNING version
//
// which is a compare-and-set under READ COMMITTED too: an UPDATE that
// waited for a concurrent writer's lock checks its WHERE again on the row
// that writer committed, so of two updates from one version exactly one
// succeeds, and the other gets ErrVersionMismatch once the first commits.
// (A row deleted by a concurrent writer may be reported as
// ErrVersionMismatch rather than ErrNotFound.) Run it in the transaction of
// the request's other writes, where it holds the row's lock until the
// commit.
//
// table may be schema-qualified ("shop.orders"); it and the columns are
// quoted as given, so they match exactly (lowercase, for names created
// unquoted), and must be letters, digits and underscores, not starting
// with a digit, of at most 63 bytes. The values are sent as parameters.
// An empty set, an invalid name, or id or version among the columns, is
// recovery.ErrInvalidInput.
func VersionedUpdate(ctx context.Context, db recovery.DBTX, table string, id any, version int64, set map[string]any) (int64, error) {
	sql, args, err := versionedUpdateSQL(table, set)
	if err != nil {
		return 0, err
	}
	var updated, current *int64
	err = db.QueryRow(ctx, sql, append([]any{id, version}, args...)...).Scan(&updated, &current)
	switch {
	case err != nil:
		return 0, fmt.Errorf("update %s: %w", table, err)
	case updated != nil:
		return *updated, nil
	case current != nil:
		return 0, fmt.Errorf("update %s: version %d: %w", table, version, ErrVersionMismatch)
	default:
		return 0, fmt.Errorf("update %s: %w", table, ErrNotFound)
	}
}

// versionedUpdateSQL is VersionedUpdate's statement, its columns in sorted
// order, and their values. The statement's outer SELECT tells a row of
// another version from no row: it reads the table as the statement's
// snapshot saw it.
func versionedUpdateSQL(table string, set map[string]any) (string, []any, error) {
	schema, name, qualified := strings.Cut(table, ".")
	ident := pgx.Identifier{schema}
	if qualified {
		ident = append(ident, name)
	}
	for _, part := range ident {
		if !isIdentifier(part) {
			return "", nil, fmt.Errorf("%w: table %q is not a name or schema.name of letters, digits and underscores", recovery.ErrInvalidInput, table)
		}
	}
	if len(set) == 0 {
		return "", nil, fmt.Errorf("%w: update %s: no column to set", recovery.ErrInvalidInput, table)
	}
	columns := slices.Sorted(maps.Keys(set))
	assignments := make([]string, 0, len(columns)+1)
	args := make([]any, 0, len(columns))
	for i, column := range columns {
		if !isIdentifier(column) || column == "id" || column == "version" {
			return "", nil, fmt.Errorf("%w: update %s: column %q is not a name of letters, digits and underscores other than id and version",
				recovery.ErrInvalidInput, table, column)
		}
		assignments = append(assignments, pgx.Identifier{column}.Sanitize()+" = $"+strconv.Itoa(i+3))
		args = append(args, set[column])
	}
	assignments = append(assignments, `"version" = "version" + 1`)
	quoted := ident.Sanitize()
	return `WITH updated AS (UPDATE ` + quoted + ` SET ` + strings.Join(assignments, ", ") +
		` WHERE "id" = $1 AND "version" = $2 RETURNING "version")
SELECT (SELECT "version" FROM updated), (SELECT "version" FROM ` + quoted + ` WHERE "id" = $1)`, args, nil
}

// maxIdentifier is PostgreSQL's longest name, in bytes (NAMEDATALEN - 1).
const maxIdentifier = 63

// isIdentifier reports whether s is a name of ASCII letters, digits and
// underscores, not starting with a digit, of at most maxIdentifier bytes.
func isIdentifier(s string) bool {
	if s == "" || len(s) > maxIdentifier || '0' <= s[0] && s[0] <= '9' {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
