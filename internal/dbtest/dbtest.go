// Package dbtest gives every test its own real PostgreSQL database.
//
// A test binary calls Main from TestMain. Main uses the server named by
// ONCEFLOW_DATABASE_URL (the user there must be allowed to CREATE DATABASE)
// or, when it is not set, starts a throwaway cluster with pgcluster. It
// never reads DATABASE_URL, which may name a developer's own database. It
// migrates a template database once; NewDatabase copies it for each test,
// so tests and packages run in parallel without seeing each other's rows.
// Runnable examples find a migrated database of their own in
// ONCEFLOW_DATABASE_URL, which Main sets once it has read it. Tests never
// skip for want of a database: without a server, Main fails the run with a
// message saying how to get one.
//
// With ONCEFLOW_TEST_PGBOUNCER=1, Main also starts a PgBouncer in
// transaction pooling mode (see package pgbouncer) and every URL it hands
// out, the examples' included, goes through it, with the pgx settings
// transaction pooling needs; creating, copying and dropping databases still
// goes straight to PostgreSQL. DirectURL gives a test the same database
// without PgBouncer, for what only PostgreSQL itself can answer.
//
// Every pool Connect and NewPool hand out checks that each statement
// onceflow's packages send through it would route by tenant in a
// distributed PostgreSQL (CheckRouting, package routing), and fails the
// test with each that would not.
//
// NewSkewedDatabase gives a test a database on a second throwaway server
// whose clock is an offset away from this machine's (through libfaketime),
// for proving that only the database clock decides leases.
package dbtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/multitracer"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/pgadmin"
	"github.com/onceflow/onceflow/internal/pgbouncer"
	"github.com/onceflow/onceflow/internal/pgcluster"
	"github.com/onceflow/onceflow/internal/routing"
)

// PgBouncerEnv names the environment variable that routes the tests
// through PgBouncer: "1" does, "" and "0" do not.
const PgBouncerEnv = "ONCEFLOW_TEST_PGBOUNCER"

// dbServer is a database server tests get databases on.
type dbServer struct {
	adminURL string // a database on the server where CREATE DATABASE runs
	template string // migrated database every test database copies
}

// server is the process-wide database server the tests use.
var server struct {
	dbServer
	bouncer *pgbouncer.Bouncer // in front of the server when PgBouncerEnv is "1"
}

// Main runs the tests of m against a real PostgreSQL and exits with their
// result. Use it as: func TestMain(m *testing.M) { dbtest.Main(m) }.
func Main(m *testing.M) {
	os.Exit(run(m))
}

// MainWithCommand builds the command in the test's package directory into a
// temporary directory as name, sets *path to the executable, runs the tests
// of m like Main, removes the executable and exits: for tests that run the
// command as a real process. Use it as:
//
//	var binary string
//	func TestMain(m *testing.M) { dbtest.MainWithCommand(m, "onceflow", &binary) }
func MainWithCommand(m *testing.M, name string, path *string) {
	MainWithBuild(m, ".", name, path)
}

// MainWithBuild is MainWithCommand for the command in package directory
// pkg (relative to the test's package directory), for tests that run
// another package's command.
func MainWithBuild(m *testing.M, pkg, name string, path *string) {
	MainWithBuilds(m, Build{Pkg: pkg, Name: name, Path: path})
}

// Build is a command MainWithBuilds builds: the one in package directory
// Pkg (relative to the test's package directory), as Name, its executable's
// path stored in *Path.
type Build struct {
	Pkg, Name string
	Path      *string
}

// MainWithBuilds is MainWithBuild for several commands, for tests that run
// them together (an application and the onceflow command, say).
func MainWithBuilds(m *testing.M, builds ...Build) {
	dir, err := os.MkdirTemp("", "onceflow-test-commands-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "dbtest:", err)
		os.Exit(1)
	}
	for _, b := range builds {
		*b.Path = filepath.Join(dir, b.Name)
		build := exec.Command("go", "build", "-o", *b.Path, b.Pkg)
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "dbtest: build %s: %v\n", b.Name, err)
			_ = os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := run(m)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// run runs the tests of m against a real PostgreSQL and returns the code
// to exit with.
func run(m *testing.M) int {
	ctx := context.Background()
	defer stopSkewedServers()
	server.adminURL = pgcluster.URLFromEnv()
	if server.adminURL == "" {
		cluster, err := pgcluster.Start(ctx, pgcluster.Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, "dbtest:", err)
			return 1
		}
		defer cluster.Stop()
		server.adminURL = cluster.URL()
	}
	if err := checkCapacity(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "dbtest:", err)
		return 1
	}
	template, err := server.createTemplate(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dbtest:", err)
		return 1
	}
	server.template = template
	defer server.dropDatabase(ctx, template)
	bouncer, err := startBouncer(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dbtest:", err)
		return 1
	}
	if bouncer != nil {
		defer bouncer.Stop()
		server.bouncer = bouncer
	}

	// Runnable examples connect through ONCEFLOW_DATABASE_URL, read above;
	// give them a migrated database of their own there. Tests that make
	// databases of their own, as a user's would (crashtest.FreshDatabase),
	// make them on its server.
	example := pgadmin.UniqueName("onceflow_example")
	if err := server.createDatabase(ctx, example, template); err != nil {
		fmt.Fprintln(os.Stderr, "dbtest:", err)
		return 1
	}
	defer server.dropDatabase(ctx, example)
	os.Setenv(pgcluster.URLEnv, clientURL(example))
	return m.Run()
}

// startBouncer starts PgBouncer in front of the server when PgBouncerEnv
// asks for it, and returns nil when it does not.
func startBouncer(ctx context.Context) (*pgbouncer.Bouncer, error) {
	switch v := os.Getenv(PgBouncerEnv); v {
	case "", "0":
		return nil, nil
	case "1":
	default:
		return nil, fmt.Errorf("%s=%q: set it to 1 to run the tests through PgBouncer, or to 0 or nothing to connect directly", PgBouncerEnv, v)
	}
	b, err := pgbouncer.Start(ctx, pgbouncer.Options{Server: server.adminURL})
	if err != nil {
		return nil, fmt.Errorf("%s=1 runs the tests through PgBouncer (unset it to connect directly): %w", PgBouncerEnv, err)
	}
	return b, nil
}

// PgBouncer is the PgBouncer the tests go through, or nil when they
// connect to PostgreSQL directly.
func PgBouncer() *pgbouncer.Bouncer { return server.bouncer }

// clientURL returns the URL tests use for database name: through PgBouncer
// when there is one.
func clientURL(name string) string {
	if server.bouncer != nil {
		return server.bouncer.URL(name)
	}
	return pgadmin.DatabaseURL(server.adminURL, name)
}

// DirectURL returns a URL for the database that connString (a URL dbtest
// handed out) names, straight to PostgreSQL, bypassing PgBouncer: for a
// test that needs one server session throughout, or that looks at the
// server's own connections (pg_stat_activity, pg_terminate_backend).
// Without PgBouncer it returns connString itself.
func DirectURL(t testing.TB, connString string) string {
	t.Helper()
	if server.bouncer == nil {
		return connString
	}
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		t.Fatal(err)
	}
	return pgadmin.DatabaseURL(server.adminURL, cfg.Database)
}

// MinConnections is the max_connections a server must allow: tests race
// up to 64 connections each, and packages run in parallel.
const MinConnections = 200

// checkCapacity fails early, with a clear message, on a server too small
// for the suite, instead of letting concurrency tests fail at random.
func checkCapacity(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, server.adminURL)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", pgadmin.Redact(server.adminURL), err)
	}
	defer conn.Close(ctx)
	var maxConns int
	if err := conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int`).Scan(&maxConns); err != nil {
		return fmt.Errorf("read max_connections: %w", err)
	}
	if maxConns < MinConnections {
		return fmt.Errorf("the server at %s allows %d connections; the tests need max_connections >= %d "+
			"(or unset ONCEFLOW_DATABASE_URL to use a throwaway cluster)",
			pgadmin.Redact(server.adminURL), maxConns, MinConnections)
	}
	return nil
}

// createTemplate makes a database with every migration applied, named
// uniquely so that several test binaries can share one server.
func (s *dbServer) createTemplate(ctx context.Context) (string, error) {
	name := pgadmin.UniqueName("onceflow_template")
	if err := s.createDatabase(ctx, name, ""); err != nil {
		return "", err
	}
	if err := pgadmin.Migrate(ctx, pgadmin.DatabaseURL(s.adminURL, name)); err != nil {
		s.dropDatabase(ctx, name)
		return "", err
	}
	return name, nil
}

// Options shapes a test database.
type Options struct {
	// Unmigrated leaves the database empty instead of copying the migrated
	// template.
	Unmigrated bool

	// Settings are server settings the database starts every session
	// with (ALTER DATABASE ... SET): the way to give a test a setting such
	// as search_path, which PgBouncer refuses as a startup parameter.
	Settings map[string]string
}

// NewDatabase creates a database for t alone, dropped when t ends, and
// returns its URL.
func NewDatabase(t testing.TB, opts Options) string {
	t.Helper()
	if server.adminURL == "" {
		t.Fatal("dbtest: the package's TestMain must call dbtest.Main")
	}
	return clientURL(server.newDatabase(t, opts))
}

// newDatabase creates a database on s for t alone, dropped when t ends,
// and returns its name.
func (s *dbServer) newDatabase(t testing.TB, opts Options) string {
	t.Helper()
	template := s.template
	if opts.Unmigrated {
		template = ""
	}
	name := pgadmin.UniqueName("onceflow_test")
	ctx := context.Background()
	if err := s.createDatabase(ctx, name, template); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.dropDatabase(context.Background(), name) })
	for setting, value := range opts.Settings {
		if err := s.admin(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" SET "+
			pgx.Identifier{setting}.Sanitize()+" TO "+quoteLiteral(value)); err != nil {
			t.Fatal(err)
		}
	}
	return name
}

// SetReadOnly makes every new session of the database connString names
// read-only (default_transaction_read_only), so that a write gets SQLSTATE
// 25006 as it does on a standby, or, with readOnly false, read-write
// again. Sessions already open keep what they had: a test makes a pool
// that fails over onto a standby by opening it after.
func SetReadOnly(t testing.TB, connString string, readOnly bool) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		t.Fatal(err)
	}
	sql := "ALTER DATABASE " + pgx.Identifier{cfg.Database}.Sanitize() + " RESET default_transaction_read_only"
	if readOnly {
		sql = "ALTER DATABASE " + pgx.Identifier{cfg.Database}.Sanitize() + " SET default_transaction_read_only TO on"
	}
	if err := server.admin(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

// NewPool connects to a new migrated database for t, with room for maxConns
// connections (0 means 8). The pool is closed when t ends.
func NewPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return Connect(t, NewDatabase(t, Options{}), maxConns)
}

// Connect opens a pool to url with room for maxConns connections (0 means
// 8), closed when t ends. It checks every statement onceflow sends through
// the pool (CheckRouting).
func Connect(t testing.TB, url string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	CheckRouting(t, cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func (s *dbServer) createDatabase(ctx context.Context, name, template string) error {
	return pgadmin.CreateDatabase(ctx, s.adminURL, name, template)
}

func (s *dbServer) dropDatabase(ctx context.Context, name string) {
	_ = pgadmin.DropDatabase(ctx, s.adminURL, name)
}

func (s *dbServer) admin(ctx context.Context, sql string) error {
	return pgadmin.Exec(ctx, s.adminURL, sql)
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// CheckRouting makes cfg's connections check every statement onceflow's
// packages send through them, and fail t with each one that would not
// route to one node of a PostgreSQL distributed by tenant (package
// routing), beside the tracer cfg has. Connect calls it; a test that
// builds its own pool config calls it too. Pools made elsewhere (processes
// that systemtest and the cmd tests start, runnable examples) are not
// checked.
func CheckRouting(t testing.TB, cfg *pgx.ConnConfig) {
	checker := &routing.Tracer{Report: func(v *routing.Violation, sender string) {
		t.Errorf("%s sent a statement that does not route by tenant: %v", sender, v)
	}}
	if cfg.Tracer == nil {
		cfg.Tracer = checker
		return
	}
	cfg.Tracer = multitracer.New(cfg.Tracer, checker)
}
