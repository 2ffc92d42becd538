// Package dbschema names the PostgreSQL schema that holds onceflow's tables
// and qualifies table names in SQL with it.
//
// SQL in onceflow writes tables as {schema}.onceflow_keys; Expand replaces
// {schema} with the configured schema, quoted, once when a store is built.
// Tables are never found through search_path, which PgBouncer's transaction
// pooling does not preserve.
package dbschema

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Default is the schema used when none is configured.
const Default = "public"

// maxIdentifier is PostgreSQL's NAMEDATALEN - 1.
const maxIdentifier = 63

// ErrInvalid reports a schema name PostgreSQL would not take as given.
var ErrInvalid = errors.New("invalid schema name")

// Resolve returns schema, or Default when schema is empty, after checking
// that PostgreSQL would keep the name as written.
func Resolve(schema string) (string, error) {
	if schema == "" {
		return Default, nil
	}
	if len(schema) > maxIdentifier {
		return "", fmt.Errorf("%w: %q is longer than %d bytes", ErrInvalid, schema, maxIdentifier)
	}
	if !utf8.ValidString(schema) || strings.ContainsRune(schema, 0) {
		return "", fmt.Errorf("%w: %q is not valid UTF-8 without NUL bytes", ErrInvalid, schema)
	}
	return schema, nil
}

// Expand replaces every {schema} in sql with the quoted schema name.
func Expand(sql, schema string) string {
	return strings.ReplaceAll(sql, "{schema}", pgx.Identifier{schema}.Sanitize())
}
