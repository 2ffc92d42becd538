package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	neturl "net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/pgcluster"
	"github.com/onceflow/onceflow/internal/pgproxy"
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
	c, err := pgcluster.Start(ctx, pgcluster.Options{Logger: cfg.Logger, Settings: serverSettings(cfg)})
	if err != nil {
		return nil, err
	}
	return &server{url: c.URL(), cluster: c}, nil
}

// serverSettings are the throwaway server's: durable, as in production,
// unless cfg.NoFsync. A durable commit waits for its WAL to reach the disk,
// which is most of what a small transaction costs and what the commit
// budget is about. pg_stat_statements, which --explain reads, is loaded
// only for it: it costs every statement a little.
func serverSettings(cfg Config) map[string]string {
	settings := map[string]string{
		"fsync":              "on",
		"full_page_writes":   "on",
		"synchronous_commit": "on",
		"max_connections":    "300",
	}
	if cfg.NoFsync {
		settings["fsync"], settings["full_page_writes"] = "off", "off"
	}
	if cfg.Explain {
		settings["shared_preload_libraries"] = "pg_stat_statements"
		settings["pg_stat_statements.track_planning"] = "on"
	}
	return settings
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
	var v, fsync, sync, fpw string
	err = conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
		current_setting('synchronous_commit'), current_setting('full_page_writes')`).Scan(&v, &fsync, &sync, &fpw)
	durability := "durable"
	if fsync != "on" || sync == "off" {
		durability = "NOT durable"
	}
	return fmt.Sprintf("PostgreSQL %s, %s (fsync %s, synchronous_commit %s, full_page_writes %s)",
		v, durability, fsync, sync, fpw), err
}

// database is a fresh, migrated database with a traced pool.
type database struct {
	pool    *pgxpool.Pool
	counter *pgtrace.Counter
	url     string
	name    string
	proxy   *pgproxy.Proxy // the network the pool goes through; nil for loopback
}

// close closes the pool and its network.
func (d *database) close() {
	d.pool.Close()
	if d.proxy != nil {
		d.proxy.Close()
	}
}

// overNetwork returns the database with a traced pool of its own, of
// maxConns connections, through a proxy that adds delay to each message in
// each direction; directly when delay is 0. Close it.
func (d *database) overNetwork(ctx context.Context, delay time.Duration, maxConns int32) (*database, error) {
	out := &database{url: d.url, name: d.name, counter: &pgtrace.Counter{}}
	url := d.url
	if delay > 0 {
		var err error
		if out.proxy, url, err = pgproxy.For(d.url, pgproxy.Options{Delay: delay}); err != nil {
			return nil, err
		}
	}
	var err error
	if out.pool, err = tracedPool(ctx, url, out.counter, maxConns); err != nil {
		if out.proxy != nil {
			out.proxy.Close()
		}
		return nil, err
	}
	return out, nil
}

// tracedPool opens a pool of maxConns connections to url, all opened at
// once, counted by counter.
func tracedPool(ctx context.Context, url string, counter *pgtrace.Counter, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Tracer = counter
	cfg.MaxConns = maxConns
	cfg.MinConns = maxConns
	return pgxpool.NewWithConfig(ctx, cfg)
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
	url := withDatabase(s.url, name)
	counter := &pgtrace.Counter{}
	pool, err := tracedPool(ctx, url, counter, maxConns)
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
	return &database{pool: pool, counter: counter, url: url, name: name}, nil
}

// withDatabase returns connString naming database name instead of its own.
func withDatabase(connString, name string) string {
	if u, err := neturl.Parse(connString); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		return u.String()
	}
	// In keyword/value form the last setting wins.
	return connString + " dbname=" + name
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
