package recovery

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/dbschema"
)

// LeaseDefault is the lease a claim takes when none is given. Size it to
// outlive the work's own timeout, so that a takeover of a live attempt stays
// the rare path.
const LeaseDefault = 30 * time.Second

// RetentionDefault is how long a finished record is kept after it
// finished, so that retries keep getting its response: the pruner's
// default retention (sweeper.PrunerConfig), and the key lifetime the HTTP
// middleware advertises by default (idemhttp.Config.KeyLifetime).
const RetentionDefault = 24 * time.Hour

// MaxErrorLength is the longest last_error kept, in bytes; longer messages
// are cut.
const MaxErrorLength = 4096

// MaxDefer is the longest a deferral holds a key back (a step's
// phase.DeferError): a longer one is cut to it, and a negative one counts
// as none. A day outlasts any Retry-After worth honouring, while a
// mistaken one (seconds read as milliseconds, a date a year out) cannot
// hide a key for longer; the record shows the time in NotBefore.
const MaxDefer = 24 * time.Hour

// DefaultResponseHeaders are the response headers stored and replayed when
// Config.ResponseHeaders is nil: those that say what the response is and
// how to treat it. Headers that belong to one connection or one client
// (Set-Cookie, Date, Content-Length) are not replayed.
var DefaultResponseHeaders = []string{
	"Content-Type", "Content-Language", "Content-Location", "Location", "ETag", "Last-Modified", "Link",
	"Retry-After", "Cache-Control", "Content-Disposition", "X-Content-Type-Options", "Vary",
	"Content-Security-Policy",
}

// neverStored are response headers no allow-list keeps: a session cookie
// replayed to a retry would hand one client's session to another, and
// Idempotency-Key-Expires (idemhttp.ExpiresHeader) is computed for each
// answer, so a stored copy would be stale on every replay.
var neverStored = []string{"Set-Cookie", "Set-Cookie2", "Idempotency-Key-Expires"}

// DBTX runs statements. *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures a Store.
type Config struct {
	// Schema holds onceflow's tables; use the schema the migrations ran
	// with. "" means "public".
	Schema string

	// ResponseHeaders lists the response headers Complete and Fail keep.
	// nil means DefaultResponseHeaders; an empty, non-nil slice keeps none.
	// Set-Cookie and Idempotency-Key-Expires are never kept, listed or not.
	ResponseHeaders []string

	// Lease is how long a claim holds a key, and how far each Advance
	// extends it: committed progress is proof that the holder is alive.
	// 0 means LeaseDefault; at least 1ms.
	Lease time.Duration

	// IdleTimeout bounds a transaction that holds a key by being open: one
	// in which a claim or takeover took the key and has not committed (a
	// workflow's first atomic phase, a resumed atomic step, an idemhttp
	// Atomic request, a Claim on the caller's transaction). Nothing else
	// holds the key then, no lease and no heartbeat, and a process cut off
	// from the server (a partition, a lost host) or frozen would hold it
	// until TCP keepalives noticed, hours by default. The claim sets
	// idle_in_transaction_session_timeout to IdleTimeout for that
	// transaction alone, so that PostgreSQL ends it once it has waited on
	// its application that long between statements: its writes roll back
	// and the key is free. A live transaction that waits that long is ended
	// too, so keep it well above the longest pause between a first phase's
	// (or an Atomic handler's) statements. A role or session that sets its
	// own idle_in_transaction_session_timeout keeps it. 0 means
	// IdleTimeoutDefault; a negative value sets nothing.
	IdleTimeout time.Duration
}

// IdleTimeoutDefault is the IdleTimeout of a Config that sets none.
const IdleTimeoutDefault = time.Minute

// maxIdleTimeout is the largest idle_in_transaction_session_timeout
// PostgreSQL takes: INT_MAX milliseconds.
const maxIdleTimeout = (1<<31 - 1) * time.Millisecond

// withDefaults returns cfg with each zero field set to its default.
func (cfg Config) withDefaults() Config {
	cfg.Schema = cmp.Or(cfg.Schema, dbschema.Default)
	if cfg.ResponseHeaders == nil {
		cfg.ResponseHeaders = DefaultResponseHeaders
	}
	cfg.Lease = cmp.Or(cfg.Lease, LeaseDefault)
	cfg.IdleTimeout = cmp.Or(cfg.IdleTimeout, IdleTimeoutDefault)
	return cfg
}

// validate reports a setting of cfg, with its defaults filled in, that is
// out of range.
func (cfg Config) validate() error {
	if _, err := dbschema.Resolve(cfg.Schema); err != nil {
		return err
	}
	if _, err := leaseMicros(cfg.Lease, LeaseDefault); err != nil {
		return err
	}
	if cfg.IdleTimeout > 0 && (cfg.IdleTimeout < time.Millisecond || cfg.IdleTimeout > maxIdleTimeout) {
		return &InputError{Field: "idle timeout", Problem: fmt.Sprintf("is %s, not between 1ms and %s (or negative, for none)", cfg.IdleTimeout, maxIdleTimeout)}
	}
	return nil
}

// Store reads and changes key records.
type Store struct {
	db      DBTX
	schema  string
	sql     *queries
	headers map[string]bool
	lease   int64 // microseconds
	inTx    bool  // db is a transaction: a failed statement ends it
}

// New returns a Store that runs its statements on db.
func New(db DBTX, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	headers := make(map[string]bool, len(cfg.ResponseHeaders))
	for _, h := range cfg.ResponseHeaders {
		headers[http.CanonicalHeaderKey(h)] = true
	}
	for _, h := range neverStored {
		delete(headers, h)
	}
	return &Store{db: db, schema: cfg.Schema, sql: newQueries(cfg.Schema, cfg.IdleTimeout), headers: headers, lease: cfg.Lease.Microseconds(),
		inTx: isTx(db)}, nil
}

// isTx says whether db is a transaction, in which a failed statement ends
// it: a claim must not run again there after a lock timeout.
func isTx(db DBTX) bool {
	_, ok := db.(pgx.Tx)
	return ok
}

// WithTx returns a Store whose statements run in tx, so that a transition
// commits or rolls back together with the caller's own writes.
func (s *Store) WithTx(tx pgx.Tx) *Store {
	c := *s
	c.db, c.inTx = tx, true
	return &c
}

// dbError is err, a statement's error, as NotMigrated sees it, with what
// failed before it.
func (s *Store) dbError(op string, err error) error {
	return fmt.Errorf("%s: %w", op, NotMigrated(s.schema, err))
}

// Lease returns the lease a claim takes by default.
func (s *Store) Lease() time.Duration { return time.Duration(s.lease) * time.Microsecond }

// keepHeaders returns the allow-listed subset of h.
func (s *Store) keepHeaders(h http.Header) http.Header {
	kept := http.Header{}
	for name, values := range h {
		if canonical := http.CanonicalHeaderKey(name); s.headers[canonical] {
			kept[canonical] = append(kept[canonical], values...)
		}
	}
	return kept
}
