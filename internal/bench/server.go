package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/pgcluster"
	"github.com/onceflow/onceflow/internal/pgtrace"
	"github.com/onceflow/onceflow/migrations"
)

// server is the PostgreSQL the suite runs on.
type server struct {
	url     string
	cluster *pgcluster.Cluster
	dbs     []string
}

func startServer(ctx context.Context, cfg Config) (*server, error) {
	if cfg.DatabaseURL != "" {
		return &server{url: cfg.DatabaseURL}, nil
	}
	c, err := pgcluster.Start(ctx, pgcluster.Options{Logger: cfg.Logger, Settings: map[string]string{
		// Durable commits, as in production: a commit costs a WAL flush,
		// which is what the commit budget is about.
		"synchronous_commit": "on",
		"max_connections":    "300",
	}})
	if err != nil {
		return nil, err
	}
	return &server{url: c.URL(), cluster: c}, nil
}

func (s *server) close() {
	ctx := context.Background()
	for _, name := range s.dbs {
		if conn, err := pgx.Connect(ctx, s.url); err == nil {
			_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			_ = conn.Close(ctx)
		}
	}
	if s.cluster != nil {
		_ = s.cluster.Stop()
	}
}

func (s *server) version(ctx context.Context) (string, error) {
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var v, fsync, sync string
	err = conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
		current_setting('synchronous_commit')`).Scan(&v, &fsync, &sync)
	return fmt.Sprintf("PostgreSQL %s (fsync %s, synchronous_commit %s)", v, fsync, sync), err
}

// database is a fresh, migrated database with a traced pool.
type database struct {
	pool    *pgxpool.Pool
	counter *pgtrace.Counter
	url     string
	name    string
}

// newDatabase creates a migrated database for one case.
func (s *server) newDatabase(ctx context.Context, maxConns int32) (*database, error) {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "onceflow_bench_" + hex.EncodeToString(b)
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		return nil, err
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	_ = conn.Close(ctx)
	if err != nil {
		return nil, fmt.Errorf("create benchmark database: %w", err)
	}
	s.dbs = append(s.dbs, name)
	cfg, err := pgxpool.ParseConfig(s.url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Database = name
	counter := &pgtrace.Counter{}
	cfg.ConnConfig.Tracer = counter
	cfg.MaxConns = maxConns
	cfg.MinConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	m, err := migrations.New(pool, migrations.Config{})
	if err == nil {
		_, err = m.Up(ctx)
	}
	if err == nil {
		_, err = pool.Exec(ctx, ordersTable) // the business table of the floors
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &database{pool: pool, counter: counter, url: cfg.ConnString(), name: name}, nil
}

// flushStats makes every idle connection of pool publish its statistics
// now, rather than within a second or so, and returns how many statements
// that took: each is a transaction of its own in xact_commit.
func flushStats(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	conns := pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for _, c := range conns {
		if _, err := c.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			return 0, fmt.Errorf("flush statistics (PostgreSQL 15 or newer): %w", err)
		}
	}
	return len(conns), nil
}

// xactCommits reads the committed transactions of database name, from a
// connection to another database so that the reading itself is not
// counted.
func (s *server) xactCommits(ctx context.Context, name string) (int64, error) {
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n int64
	err = conn.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = $1`, name).Scan(&n)
	return n, err
}
