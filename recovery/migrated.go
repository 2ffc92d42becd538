package recovery

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/dbschema"
)

// ErrNotMigrated reports that onceflow's tables or functions are missing
// from the database, or older than this build needs: the schema was not
// migrated, or was migrated by an older build. Nothing ran. Apply the
// migrations first (`onceflow migrate up`, or migrations.Migrator.Up);
// *NotMigratedError says which schema.
var ErrNotMigrated = errors.New("onceflow's tables are missing or older than this build")

// NotMigratedError is the ErrNotMigrated of one schema, with the cause:
// the database's error, or the version migrations.Migrator.Check found.
type NotMigratedError struct {
	Schema string
	Cause  error
}

// Error names the schema and the command that migrates it.
func (e *NotMigratedError) Error() string {
	command := "onceflow migrate up"
	if e.Schema != dbschema.Default {
		command += " --schema " + e.Schema
	}
	return fmt.Sprintf("%v in schema %q: run `%s` (or migrations.Migrator.Up) before starting: %v",
		ErrNotMigrated, e.Schema, command, e.Cause)
}

// Is makes errors.Is(err, ErrNotMigrated) true.
func (e *NotMigratedError) Is(target error) bool { return target == ErrNotMigrated }

// Unwrap returns the cause.
func (e *NotMigratedError) Unwrap() error { return e.Cause }

// SQLSTATEs of a name the database does not know. In a statement of
// onceflow's own they mean the schema is behind this build: the schema
// itself (invalid_schema_name), a table (undefined_table), a column
// (undefined_column) or a function, or a function of this build's
// signature (undefined_function), is missing.
const (
	invalidSchemaName = "3F000"
	undefinedTable    = "42P01"
	undefinedColumn   = "42703"
	undefinedFunction = "42883"
)

// NotMigrated returns err as a *NotMigratedError of schema when it is the
// database saying that the schema, or a table, column or function, that
// one of onceflow's own statements uses does not exist; any other error,
// nil included, as it is. Every package that runs onceflow's SQL passes
// its errors through it; errors of the application's own statements must
// not go through it, since their missing tables are not onceflow's.
func NotMigrated(schema string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || errors.Is(err, ErrNotMigrated) {
		return err
	}
	switch pgErr.Code {
	case invalidSchemaName, undefinedTable, undefinedColumn, undefinedFunction:
		return &NotMigratedError{Schema: schema, Cause: err}
	}
	return err
}
