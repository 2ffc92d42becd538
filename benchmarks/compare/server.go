package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// server is the one PostgreSQL every side runs on, each in a database of
// its own.
type server struct {
	url  string
	stop func()
	dbs  []string
}

// startServer connects to url or, when url is empty, starts a throwaway
// server that commits durably.
func startServer(ctx context.Context, url string) (*server, error) {
	if url != "" {
		return &server{url: url, stop: func() {}}, nil
	}
	u, stop, err := startPostgres(ctx)
	if err != nil {
		return nil, err
	}
	return &server{url: u, stop: stop}, nil
}

// describe names the server's version and commit settings, for the table's
// header.
func (s *server) describe(ctx context.Context) (string, error) {
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var v, fsync, fpw, sync string
	err = conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
		current_setting('full_page_writes'), current_setting('synchronous_commit')`).Scan(&v, &fsync, &fpw, &sync)
	return fmt.Sprintf("PostgreSQL %s, fsync=%s, full_page_writes=%s, synchronous_commit=%s", v, fsync, fpw, sync), err
}

// close drops the databases the run created and stops a throwaway server.
func (s *server) close() {
	ctx := context.Background()
	if conn, err := pgx.Connect(ctx, s.url); err == nil {
		for _, name := range s.dbs {
			_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		}
		_ = conn.Close(ctx)
	}
	s.stop()
}

// ordersTable is the checkout's business table, the same as onceflow
// bench's.
const ordersTable = `CREATE TABLE bench_orders (id bigserial PRIMARY KEY, key text NOT NULL, amount bigint NOT NULL,
	status text NOT NULL)`

// database is a fresh database holding the orders table, with a pool of
// fixed size.
type database struct {
	name string
	pool *pgxpool.Pool
}

// newDatabase creates a database for one side.
func (s *server) newDatabase(ctx context.Context, side string, conns int32) (*database, error) {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "compare_" + side + "_" + hex.EncodeToString(b)
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		return nil, err
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	_ = conn.Close(ctx)
	if err != nil {
		return nil, fmt.Errorf("create database for %s: %w", side, err)
	}
	s.dbs = append(s.dbs, name)
	cfg, err := pgxpool.ParseConfig(s.url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Database = name
	cfg.MaxConns, cfg.MinConns = conns, conns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, ordersTable); err != nil {
		pool.Close()
		return nil, err
	}
	return &database{name: name, pool: pool}, nil
}

// flushStats makes a backend publish its statistics when it next goes
// idle, this statement's commit included. It reads a table: a backend that
// touched none publishes no database statistics, so its commits would be
// counted only at its next statement that did.
const flushStats = `SELECT pg_stat_force_next_flush() FROM pg_class LIMIT 1`

// commits returns the transactions committed in db so far. It first makes
// every idle connection of db's pool publish its statistics (a backend does
// so at most once a second on its own), and reads from a connection to
// another database, so that the reading is not counted; the flushing
// statements are, and come back as flushed so the caller can subtract them.
func (s *server) commits(ctx context.Context, db *database) (n int64, flushed int, err error) {
	conns := db.pool.AcquireAllIdle(ctx)
	for _, c := range conns {
		if err == nil {
			_, err = c.Exec(ctx, flushStats)
		}
		c.Release()
	}
	if err != nil {
		return 0, 0, fmt.Errorf("flush statistics (PostgreSQL 15 or newer): %w", err)
	}
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = $1`, db.name).Scan(&n)
	return n, len(conns), err
}
