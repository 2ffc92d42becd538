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
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Default is the schema used when none is configured.
const Default = "public"

// Pattern is the form a schema name must have: a letter or underscore,
// then up to 62 letters, digits or underscores (PostgreSQL keeps 63 bytes
// of a name). A name of this form needs no escaping anywhere it is written,
// not even inside a dollar-quoted function body, where quoting does not
// protect it.
const Pattern = `[A-Za-z_][A-Za-z0-9_]{0,62}`

var valid = regexp.MustCompile(`^` + Pattern + `$`)

// ErrInvalid reports a schema name that is not of the form Pattern.
var ErrInvalid = errors.New("invalid schema name")

// Resolve returns schema, or Default when schema is empty, after checking
// that it is of the form Pattern. Every configuration that names a schema
// goes through it.
func Resolve(schema string) (string, error) {
	if schema == "" {
		return Default, nil
	}
	if !valid.MatchString(schema) {
		return "", fmt.Errorf("%w: %q: a schema name is a letter or underscore, then at most 62 letters, digits or underscores",
			ErrInvalid, schema)
	}
	return schema, nil
}

// Expand replaces every {schema} in sql with the quoted schema name.
func Expand(sql, schema string) string {
	return strings.ReplaceAll(sql, "{schema}", pgx.Identifier{schema}.Sanitize())
}
