package migrations_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbschema"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/migrations"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func newEmpty(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true}), 8)
}

func tableExists(t *testing.T, db *pgxpool.Pool, qualified string) bool {
	t.Helper()
	var exists bool
	require.NoError(t, db.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, qualified).Scan(&exists))
	return exists
}

func TestUpDownStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newEmpty(t)
	m, err := migrations.New(db, migrations.Config{})
	require.NoError(t, err)

	status, err := m.Status(ctx)
	require.NoError(t, err)
	require.Len(t, status, migrations.Latest())
	for _, s := range status {
		require.False(t, s.Applied, "migration %d", s.Version)
	}
	version, err := m.Version(ctx)
	require.NoError(t, err)
	require.Zero(t, version)
	require.False(t, tableExists(t, db, "public.onceflow_migrations"), "Status and Version must not create anything")

	applied, err := m.Up(ctx)
	require.NoError(t, err)
	require.Len(t, applied, migrations.Latest())
	require.Equal(t, 1, applied[0].Version)
	require.True(t, tableExists(t, db, "public.onceflow_keys"))

	again, err := m.Up(ctx)
	require.NoError(t, err)
	require.Empty(t, again, "a second Up applies nothing")

	status, err = m.Status(ctx)
	require.NoError(t, err)
	for _, s := range status {
		require.True(t, s.Applied, "migration %d", s.Version)
		require.False(t, s.AppliedAt.IsZero())
	}

	reverted, err := m.Down(ctx)
	require.NoError(t, err)
	require.Len(t, reverted, 1)
	require.Equal(t, migrations.Latest(), reverted[0].Version)
	version, err = m.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest()-1, version)

	_, err = m.To(ctx, 0)
	require.NoError(t, err)
	require.False(t, tableExists(t, db, "public.onceflow_keys"))
	none, err := m.Down(ctx)
	require.NoError(t, err)
	require.Empty(t, none, "Down at version 0 does nothing")

	_, err = m.Up(ctx)
	require.NoError(t, err, "migrations apply again after a full revert")
	require.True(t, tableExists(t, db, "public.onceflow_keys"))
}

func TestConcurrentMigrators(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true})

	const migrators = 4
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		results = make([][]migrations.Migration, migrators)
		errs    = make([]error, migrators)
	)
	for i := range migrators {
		conn, err := pgx.Connect(ctx, url) // one process each, in effect
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close(ctx) })
		m, err := migrations.New(conn, migrations.Config{Schema: "shared"})
		require.NoError(t, err)
		wg.Go(func() {
			<-start
			results[i], errs[i] = m.Up(ctx)
		})
	}
	close(start)
	wg.Wait()

	total := 0
	for i := range migrators {
		require.NoError(t, errs[i], "migrator %d", i)
		total += len(results[i])
	}
	require.Equal(t, migrations.Latest(), total, "each migration is applied by exactly one migrator")

	db := dbtest.Connect(t, url, 2)
	var rows int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM shared.onceflow_migrations`).Scan(&rows))
	require.Equal(t, migrations.Latest(), rows)
}

func TestSchemaIsQualifiedExplicitly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A search_path that finds nothing: only explicit qualification works.
	// The database's default, not a startup parameter: PgBouncer refuses those.
	url := dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true, Settings: map[string]string{"search_path": "pg_catalog"}})
	db := dbtest.Connect(t, url, 0)

	m, err := migrations.New(db, migrations.Config{Schema: "Billing_EU"})
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)

	require.True(t, tableExists(t, db, `"Billing_EU".onceflow_keys`), "the name is quoted: its case is kept")
	require.False(t, tableExists(t, db, `billing_eu.onceflow_keys`))
	require.False(t, tableExists(t, db, `public.onceflow_keys`))
	version, err := m.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), version)

	// Another schema in the same database migrates independently.
	other, err := migrations.New(db, migrations.Config{Schema: "other"})
	require.NoError(t, err)
	version, err = other.Version(ctx)
	require.NoError(t, err)
	require.Zero(t, version)
}

func TestInvalidTargetAndSchema(t *testing.T) {
	t.Parallel()
	db := newEmpty(t)
	m, err := migrations.New(db, migrations.Config{})
	require.NoError(t, err)
	_, err = m.To(context.Background(), -1)
	require.ErrorIs(t, err, migrations.ErrInvalidTarget)
	_, err = m.To(context.Background(), migrations.Latest()+1)
	require.ErrorIs(t, err, migrations.ErrInvalidTarget)

	_, err = migrations.New(db, migrations.Config{Schema: string(make([]byte, 64))})
	require.Error(t, err)
}

// TestSchemaNameCannotInject: a schema name is written into the migrations'
// SQL, inside dollar-quoted function bodies too, where quoting the name
// protects nothing. A name that would break out of the body ($$), or out of
// its quotes ("), is refused before anything runs, and no migration quotes
// a body with the bare $$ tag.
func TestSchemaNameCannotInject(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true, Settings: map[string]string{"check_function_bodies": "off"}})
	db := dbtest.Connect(t, url, 2)
	for _, schema := range []string{
		`a$$;CREATE TABLE IF NOT EXISTS public.pwned();SELECT $$`, // within 63 bytes,
		`x"; CREATE TABLE public.pwned (); --`,
	} {
		_, err := migrations.New(db, migrations.Config{Schema: schema})
		require.ErrorIs(t, err, dbschema.ErrInvalid, "%q", schema)
	}
	require.False(t, tableExists(t, db, "public.pwned"))

	for _, m := range migrations.All() {
		up, down := migrations.Bodies(m)
		require.NotContains(t, up, "$$", "migration %d up: a dollar-quoted body needs a named tag", m.Version)
		require.NotContains(t, down, "$$", "migration %d down: a dollar-quoted body needs a named tag", m.Version)
	}
}

func TestNewerDatabaseIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newEmpty(t)
	m, err := migrations.New(db, migrations.Config{})
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `INSERT INTO public.onceflow_migrations (version, name) VALUES (9999, 'from_the_future')`)
	require.NoError(t, err)

	_, err = m.Up(ctx)
	require.ErrorIs(t, err, migrations.ErrUnknownVersion)
	_, err = m.Status(ctx)
	require.ErrorIs(t, err, migrations.ErrUnknownVersion)
}

func TestLoadRejectsBrokenSets(t *testing.T) {
	t.Parallel()
	cases := map[string]fstest.MapFS{
		"gap": {
			"sql/0001_a.up.sql": {Data: []byte("SELECT 1")}, "sql/0001_a.down.sql": {Data: []byte("SELECT 1")},
			"sql/0003_c.up.sql": {Data: []byte("SELECT 1")}, "sql/0003_c.down.sql": {Data: []byte("SELECT 1")},
		},
		"missing down": {"sql/0001_a.up.sql": {Data: []byte("SELECT 1")}},
		"bad name":     {"sql/1_a.sql": {Data: []byte("SELECT 1")}},
		"two names": {
			"sql/0001_a.up.sql": {Data: []byte("SELECT 1")}, "sql/0001_b.down.sql": {Data: []byte("SELECT 1")},
		},
		"empty": {"sql/README": {Data: nil}},
	}
	for name, fsys := range cases {
		_, err := migrations.Load(fsys)
		require.Error(t, err, name)
	}
	good := fstest.MapFS{"sql/0001_a.up.sql": {Data: []byte("SELECT 1")}, "sql/0001_a.down.sql": {Data: []byte("SELECT 1")}}
	loaded, err := migrations.Load(good)
	require.NoError(t, err)
	require.Len(t, loaded, 1)
}

// TestKeyRecordRulesHoldInSQL writes records past onceflow's Go checks and
// expects the database to refuse each broken one: the input lengths, the
// status values, and a lease exactly while in flight.
func TestKeyRecordRulesHoldInSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.NewPool(t, 4)
	const insert = `INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, owner, status,
		locked_until, response_status, completed_at)
	VALUES ($1, $2, gen_random_uuid(), $7, sha256('x'), gen_random_uuid(), $3, $4, $5, $6)`
	future := "infinity"
	cases := []struct {
		name                string
		tenant, key, status string
		lockedUntil         *string
		responseStatus      *int
		completedAt         *string
		emptyWorkflow       bool
		valid               bool
	}{
		{name: "in flight", tenant: "t", key: "ok", status: "in_flight", lockedUntil: &future, valid: true},
		{name: "completed", tenant: "t", key: "done", status: "completed", responseStatus: ptr(200), completedAt: ptr("now"), valid: true},
		{name: "empty tenant", tenant: "", key: "k1", status: "in_flight", lockedUntil: &future},
		{name: "key over 255 bytes", tenant: "t", key: strings.Repeat("k", 256), status: "in_flight", lockedUntil: &future},
		{name: "unknown status", tenant: "t", key: "k2", status: "paused", lockedUntil: &future},
		{name: "in flight without a lease", tenant: "t", key: "k3", status: "in_flight"},
		{name: "workflow empty", tenant: "t", key: "k9", status: "in_flight", lockedUntil: &future, emptyWorkflow: true},
		{name: "completed with a lease", tenant: "t", key: "k5", status: "completed", lockedUntil: &future, responseStatus: ptr(200), completedAt: ptr("now")},
	}
	for _, c := range cases {
		workflow := "wf"
		if c.emptyWorkflow {
			workflow = ""
		}
		_, err := db.Exec(ctx, insert, c.tenant, c.key, c.status, c.lockedUntil, c.responseStatus, c.completedAt, workflow)
		if c.valid {
			require.NoError(t, err, c.name)
			continue
		}
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, c.name)
		require.Equal(t, "23514", pgErr.Code, "%s: want a check violation, got %v", c.name, err)
	}
}

func ptr[T any](v T) *T { return &v }
