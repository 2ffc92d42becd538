package migrations

import (
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/dbschema"
)

// versionTable returns the version table's qualified, quoted name, the form
// to_regclass takes.
func versionTable(schema string) string {
	return pgx.Identifier{schema, "onceflow_migrations"}.Sanitize()
}

// migratorSQL holds the migrator's own statements with the schema filled in.
type migratorSQL struct {
	lock, schemaExists, createSchema, createTable, tableExists string
	current, list, record, forget                              string
}

func newMigratorSQL(schema string) migratorSQL {
	table := "{schema}.onceflow_migrations"
	return migratorSQL{
		lock:         `SELECT pg_advisory_xact_lock($1)`,
		schemaExists: `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`,
		createSchema: dbschema.Expand(`CREATE SCHEMA {schema}`, schema),
		createTable: dbschema.Expand(`CREATE TABLE IF NOT EXISTS `+table+` (
			version    integer     PRIMARY KEY,
			name       text        NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
		)`, schema),
		tableExists: `SELECT to_regclass($1) IS NOT NULL`,
		current:     dbschema.Expand(`SELECT coalesce(max(version), 0) FROM `+table, schema),
		list:        dbschema.Expand(`SELECT version, applied_at FROM `+table+` ORDER BY version`, schema),
		record:      dbschema.Expand(`INSERT INTO `+table+` (version, name) VALUES ($1, $2)`, schema),
		forget:      dbschema.Expand(`DELETE FROM `+table+` WHERE version = $1 AND name = $2`, schema),
	}
}
