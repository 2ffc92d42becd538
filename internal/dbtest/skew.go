package dbtest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/pgadmin"
	"github.com/onceflow/onceflow/internal/pgcluster"
)

// ErrNoFaketime reports that libfaketime, which skews a server's clock, is
// not installed. Its message says how to install it.
var ErrNoFaketime = errors.New("dbtest: a database with a skewed clock needs libfaketime, " +
	"which is not installed: install it (Debian/Ubuntu: apt-get install faketime; " +
	"Fedora: dnf install libfaketime; or build it from https://github.com/wolfcw/libfaketime)")

// faketimeLibraries are where distributions install libfaketime, as globs.
// A variable so that a test can look elsewhere.
var faketimeLibraries = []string{
	"/usr/lib/*/faketime/libfaketime.so.1", // Debian, Ubuntu
	"/usr/lib64/faketime/libfaketime.so.1", // Fedora
	"/usr/lib/faketime/libfaketime.so.1",
	"/usr/local/lib/faketime/libfaketime.so.1",
}

// skewedServers holds the servers with a skewed clock, one per skew, each
// started when a test first asks for it and stopped when Main returns.
var skewedServers struct {
	mu sync.Mutex
	by map[time.Duration]*skewedServer
}

type skewedServer struct {
	start   sync.Once
	err     error
	cluster *pgcluster.Cluster
	dbServer
}

// NewSkewedDatabase creates a migrated database for t alone, dropped when t
// ends, on a PostgreSQL server whose clock is skew ahead of this machine's
// (behind when skew is negative), and returns its URL: clock_timestamp()
// and now() there read the machine's time plus skew. It is for proving
// that the database clock alone decides what depends on time.
//
// The server is a throwaway cluster of its own, one per skew in a test
// binary, started on first use (a second or two) and stopped when Main
// returns, even when ONCEFLOW_DATABASE_URL names another server; URLs go
// to it directly, never through PgBouncer. Its clock is skewed by
// libfaketime, preloaded into the server; without libfaketime the test
// fails with ErrNoFaketime, which says how to install it. skew must be a
// whole number of seconds.
//
// Only the wall clock is skewed: the server's waits (pg_sleep, lock waits)
// run on the monotonic clock, which libfaketime is told to leave alone.
// Server-side timeouts (statement_timeout, lock_timeout,
// deadlock_timeout) are not to be relied on there: the alarm that ends
// them reads the real time, so with the clock ahead they never fire and
// with it behind they fire at the first alarm.
func NewSkewedDatabase(t testing.TB, skew time.Duration, opts Options) string {
	t.Helper()
	if server.adminURL == "" {
		t.Fatal("dbtest: the package's TestMain must call dbtest.Main")
	}
	s, err := skewedServerFor(skew)
	if err != nil {
		t.Fatal(err)
	}
	return pgadmin.DatabaseURL(s.adminURL, s.newDatabase(t, opts))
}

// skewedServerFor returns the running server skewed by skew, starting it
// if no test has asked for it yet.
func skewedServerFor(skew time.Duration) (*skewedServer, error) {
	if skew%time.Second != 0 {
		return nil, fmt.Errorf("dbtest: a clock skew of %s is not a whole number of seconds", skew)
	}
	skewedServers.mu.Lock()
	if skewedServers.by == nil {
		skewedServers.by = map[time.Duration]*skewedServer{}
	}
	s := skewedServers.by[skew]
	if s == nil {
		s = &skewedServer{}
		skewedServers.by[skew] = s
	}
	skewedServers.mu.Unlock()
	s.start.Do(func() { s.err = s.run(context.Background(), skew) })
	return s, s.err
}

// run starts the cluster with its clock skewed, checks that the skew took
// effect, and migrates a template.
func (s *skewedServer) run(ctx context.Context, skew time.Duration) error {
	lib, err := findFaketime()
	if err != nil {
		return err
	}
	s.cluster, err = pgcluster.Start(ctx, pgcluster.Options{Env: skewedClockEnv(lib, skew)})
	if err != nil {
		return fmt.Errorf("dbtest: a database with a skewed clock runs on a throwaway cluster of its own: %w", err)
	}
	s.adminURL = s.cluster.URL()
	if err := checkSkew(ctx, s.adminURL, skew, lib); err != nil {
		return err
	}
	s.template, err = s.createTemplate(ctx)
	return err
}

// skewedClockEnv preloads libfaketime into the server, shifting its wall
// clock by skew and leaving its monotonic clock alone.
func skewedClockEnv(lib string, skew time.Duration) []string {
	return []string{
		"LD_PRELOAD=" + lib,
		fmt.Sprintf("FAKETIME=%+d", int64(skew/time.Second)),
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
	}
}

// findFaketime returns the path of libfaketime, or ErrNoFaketime.
func findFaketime() (string, error) {
	for _, pattern := range faketimeLibraries {
		if found, _ := filepath.Glob(pattern); len(found) > 0 {
			return found[0], nil
		}
	}
	return "", ErrNoFaketime
}

// checkSkew fails unless a new session on url reads the clock skew ahead
// of this machine's (within a second: both read the same clock).
func checkSkew(ctx context.Context, url string, skew time.Duration, lib string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("dbtest: connect to the skewed server: %w", err)
	}
	defer conn.Close(ctx)
	var dbNow time.Time
	before := time.Now()
	if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&dbNow); err != nil {
		return fmt.Errorf("dbtest: read the skewed server's clock: %w", err)
	}
	after := time.Now()
	if got := dbNow.Add(-skew); got.Before(before.Add(-time.Second)) || got.After(after.Add(time.Second)) {
		return fmt.Errorf("dbtest: the server started with %s preloaded reads %s, %s off this machine's clock instead of %s",
			lib, dbNow.Format(time.RFC3339Nano), dbNow.Sub(after).Round(time.Millisecond), skew)
	}
	return nil
}

// stopSkewedServers stops every server NewSkewedDatabase started.
func stopSkewedServers() {
	skewedServers.mu.Lock()
	defer skewedServers.mu.Unlock()
	for _, s := range skewedServers.by {
		if s.cluster != nil {
			_ = s.cluster.Stop()
		}
	}
}
