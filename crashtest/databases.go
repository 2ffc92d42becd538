package crashtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/pgadmin"
)

// ServerEnv names the environment variable that Databases reads when it is
// given no server URL: a PostgreSQL URL whose user may CREATE DATABASE.
const ServerEnv = "ONCEFLOW_DATABASE_URL"

// ErrNoServer reports that Databases was given no server URL and ServerEnv
// is not set.
var ErrNoServer = errors.New("crashtest: no PostgreSQL server: pass a server URL or set " + ServerEnv +
	" to a URL whose user may CREATE DATABASE")

// Databases makes a fresh database for each world on one PostgreSQL
// server: created, migrated with package migrations, and dropped by Close.
// A world built on one sees nothing any other world wrote, so a crashed
// attempt of one experiment cannot leak into the next. It is safe for
// concurrent use.
type Databases struct {
	server string

	mu     sync.Mutex
	pools  []*pgxpool.Pool
	names  []string
	closed bool
}

// NewDatabases returns Databases on the server serverURL connects to (any
// database on it; its user must be allowed to CREATE DATABASE). An empty
// serverURL means the value of ServerEnv.
func NewDatabases(serverURL string) (*Databases, error) {
	if serverURL == "" {
		serverURL = os.Getenv(ServerEnv)
	}
	if serverURL == "" {
		return nil, ErrNoServer
	}
	return &Databases{server: serverURL}, nil
}

// New creates a database, applies every migration of package migrations
// to it, and returns a pool connected to it. Close closes the pool and
// drops the database.
func (d *Databases) New(ctx context.Context) (*pgxpool.Pool, error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, errors.New("crashtest: Databases.New after Close")
	}
	name := pgadmin.UniqueName("crashtest")
	d.names = append(d.names, name)
	d.mu.Unlock()

	if err := pgadmin.CreateDatabase(ctx, d.server, name, ""); err != nil {
		return nil, fmt.Errorf("crashtest: create a database: %w", err)
	}
	url := pgadmin.DatabaseURL(d.server, name)
	if err := pgadmin.Migrate(ctx, url); err != nil {
		return nil, fmt.Errorf("crashtest: %w", err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("crashtest: connect to the new database: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		pool.Close()
		return nil, errors.New("crashtest: Databases.New after Close")
	}
	d.pools = append(d.pools, pool)
	return pool, nil
}

// Close closes every pool New returned and drops every database it
// created. It is safe to call twice.
func (d *Databases) Close() error {
	d.mu.Lock()
	pools, names := d.pools, d.names
	d.pools, d.names, d.closed = nil, nil, true
	d.mu.Unlock()
	for _, p := range pools {
		p.Close()
	}
	var errs []error
	for _, name := range names {
		if err := pgadmin.DropDatabase(context.Background(), d.server, name); err != nil {
			errs = append(errs, fmt.Errorf("crashtest: %w", err))
		}
	}
	return errors.Join(errs...)
}

// FreshDatabase returns a pool connected to a new migrated database on the
// server serverURL connects to ("" means ServerEnv), closed and dropped
// when t ends. It fails t when there is no server or the database cannot
// be made. Call it in Case.NewWorld to give each world a database of its
// own.
func FreshDatabase(t testing.TB, serverURL string) *pgxpool.Pool {
	t.Helper()
	dbs, err := NewDatabases(serverURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dbs.Close(); err != nil {
			t.Error(err)
		}
	})
	pool, err := dbs.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return pool
}
