package migrations

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/dbschema"
	"github.com/onceflow/onceflow/recovery"
)

// ErrUnknownVersion reports a database migrated by a newer build than this
// one: it is at a version this build has no files for.
var ErrUnknownVersion = errors.New("database schema is newer than this build")

// ErrInvalidTarget reports a target version outside 0..Latest().
var ErrInvalidTarget = errors.New("invalid target version")

// Beginner starts transactions; *pgxpool.Pool and *pgx.Conn satisfy it.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// readCommitted is the isolation of every migration transaction, whatever
// the server's default: a migrator that waited for the lock must see what
// the one before it applied.
var readCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// Config configures a Migrator.
type Config struct {
	// Schema holds the tables. "" means "public". The schema is created if
	// it does not exist.
	Schema string

	// Logger receives one line per migration applied or reverted. nil
	// discards them.
	Logger *slog.Logger
}

// withDefaults returns cfg with each zero field set to its default.
func (cfg Config) withDefaults() Config {
	cfg.Schema = cmp.Or(cfg.Schema, dbschema.Default)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	return cfg
}

// validate reports a schema name that breaks the naming rules.
func (cfg Config) validate() error {
	_, err := dbschema.Resolve(cfg.Schema)
	return err
}

// Migrator applies and reverts migrations on one database schema.
type Migrator struct {
	db      Beginner
	schema  string
	lockKey int64
	logger  *slog.Logger
	sql     migratorSQL
}

// Status is a known migration and whether the database has it.
type Status struct {
	Migration
	Applied   bool
	AppliedAt time.Time // zero unless Applied
}

// New returns a Migrator for the schema in cfg.
func New(db Beginner, cfg Config) (*Migrator, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	schema, logger := cfg.Schema, cfg.Logger
	h := fnv.New64a()
	h.Write([]byte("onceflow.migrate." + schema))
	return &Migrator{
		db:      db,
		schema:  schema,
		lockKey: int64(h.Sum64()),
		logger:  logger,
		sql:     newMigratorSQL(schema),
	}, nil
}

// Up applies every migration not yet applied and returns those it applied.
func (m *Migrator) Up(ctx context.Context) ([]Migration, error) {
	return m.To(ctx, Latest())
}

// Down reverts the most recent migration. It returns the reverted migration,
// or none when the database has no migrations applied.
func (m *Migrator) Down(ctx context.Context) ([]Migration, error) {
	version, err := m.Version(ctx)
	if err != nil || version == 0 {
		return nil, err
	}
	return m.To(ctx, version-1)
}

// To migrates up or down until the database is at version target (0 reverts
// everything) and returns the migrations applied or reverted, in the order
// it ran them. Each runs in its own transaction under the migration lock, so
// a concurrent migrator never applies a step twice.
func (m *Migrator) To(ctx context.Context, target int) ([]Migration, error) {
	if target < 0 || target > Latest() {
		return nil, fmt.Errorf("%w: %d (this build knows 0 to %d)", ErrInvalidTarget, target, Latest())
	}
	var done []Migration
	for {
		mig, err := m.step(ctx, target)
		if err != nil {
			return done, err
		}
		if mig == nil {
			return done, nil
		}
		done = append(done, *mig)
	}
}

// step moves one migration towards target in one transaction. It returns nil
// when the database is already at target.
func (m *Migrator) step(ctx context.Context, target int) (*Migration, error) {
	var done *Migration
	err := pgx.BeginTxFunc(ctx, m.db, readCommitted, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, m.sql.lock, m.lockKey); err != nil {
			return fmt.Errorf("take migration lock: %w", err)
		}
		if err := m.ensureVersionTable(ctx, tx); err != nil {
			return err
		}
		var current int
		if err := tx.QueryRow(ctx, m.sql.current).Scan(&current); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		if current > Latest() {
			return fmt.Errorf("%w: it is at version %d, this build knows up to %d", ErrUnknownVersion, current, Latest())
		}
		switch {
		case current < target:
			done = &all[current] // version current+1
			return m.run(ctx, tx, *done, "up", done.up, m.sql.record)
		case current > target:
			done = &all[current-1]
			return m.run(ctx, tx, *done, "down", done.down, m.sql.forget)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return done, nil
}

func (m *Migrator) run(ctx context.Context, tx pgx.Tx, mig Migration, direction, body, versionSQL string) error {
	if _, err := tx.Exec(ctx, dbschema.Expand(body, m.schema)); err != nil {
		return fmt.Errorf("migration %04d_%s %s: %w", mig.Version, mig.Name, direction, err)
	}
	tag, err := tx.Exec(ctx, versionSQL, mig.Version, mig.Name)
	if err != nil {
		return fmt.Errorf("record migration %04d_%s %s: %w", mig.Version, mig.Name, direction, err)
	}
	if tag.RowsAffected() != 1 {
		// A version row under another name: the files were renamed since.
		return fmt.Errorf("record migration %04d_%s %s: the version table names version %d differently",
			mig.Version, mig.Name, direction, mig.Version)
	}
	m.logger.InfoContext(ctx, "migration "+direction,
		slog.Int("version", mig.Version), slog.String("name", mig.Name), slog.String("schema", m.schema))
	return nil
}

// ensureVersionTable creates the schema and the version table when missing.
// It runs under the migration lock, so concurrent migrators do not race.
func (m *Migrator) ensureVersionTable(ctx context.Context, tx pgx.Tx) error {
	var exists bool
	if err := tx.QueryRow(ctx, m.sql.schemaExists, m.schema).Scan(&exists); err != nil {
		return fmt.Errorf("look up schema %q: %w", m.schema, err)
	}
	if !exists {
		if _, err := tx.Exec(ctx, m.sql.createSchema); err != nil {
			return fmt.Errorf("create schema %q: %w", m.schema, err)
		}
	}
	if _, err := tx.Exec(ctx, m.sql.createTable); err != nil {
		return fmt.Errorf("create version table: %w", err)
	}
	return nil
}

// Version returns the highest applied migration, 0 when none is.
func (m *Migrator) Version(ctx context.Context) (int, error) {
	applied, err := m.applied(ctx)
	if err != nil {
		return 0, err
	}
	version := 0
	for v := range applied {
		version = max(version, v)
	}
	return version, nil
}

// Check returns a *recovery.NotMigratedError (recovery.ErrNotMigrated)
// when the database is behind this build: some of its migrations are not
// applied, or none is. Call it at start-up, before serving, in a process
// that does not migrate itself, so that the first request is not where an
// unmigrated database shows. It creates nothing. A database a newer build
// migrated further passes: during a rolling deploy the old build's
// processes keep running while the new build migrates.
func (m *Migrator) Check(ctx context.Context) error {
	version, err := m.Version(ctx)
	if err != nil {
		return err
	}
	if version < Latest() {
		return &recovery.NotMigratedError{Schema: m.schema,
			Cause: fmt.Errorf("the database is at version %d, this build needs %d", version, Latest())}
	}
	return nil
}

// Status lists every migration this build knows and whether it is applied.
// It returns ErrUnknownVersion (with the known list) when the database has
// migrations this build does not know.
func (m *Migrator) Status(ctx context.Context) ([]Status, error) {
	applied, err := m.applied(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Status, 0, len(all))
	for _, mig := range all {
		at, ok := applied[mig.Version]
		out = append(out, Status{Migration: mig, Applied: ok, AppliedAt: at})
		delete(applied, mig.Version)
	}
	if len(applied) > 0 {
		newest := slices.Max(slices.Collect(maps.Keys(applied)))
		return out, fmt.Errorf("%w: version %d is applied, this build knows up to %d", ErrUnknownVersion, newest, Latest())
	}
	return out, nil
}

// applied reads the version table without creating anything.
func (m *Migrator) applied(ctx context.Context) (map[int]time.Time, error) {
	applied := map[int]time.Time{}
	err := pgx.BeginTxFunc(ctx, m.db, readCommitted, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, m.sql.tableExists, versionTable(m.schema)).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return nil
		}
		rows, err := tx.Query(ctx, m.sql.list)
		if err != nil {
			return err
		}
		var (
			version int
			at      time.Time
		)
		_, err = pgx.ForEachRow(rows, []any{&version, &at}, func() error {
			applied[version] = at
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	return applied, nil
}
