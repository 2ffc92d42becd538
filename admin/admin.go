package admin

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// MaxBulkDefault is how many records a bulk action acts on at most when
// Config.MaxBulk is 0.
const MaxBulkDefault = 1000

// MaxBulkLimit is the hard cap on Config.MaxBulk.
const MaxBulkLimit = 10000

// Role is what an operator may do.
type Role int

const (
	// RoleNone may do nothing: every request is refused (403).
	RoleNone Role = iota
	// RoleRead may list and show records and outbox messages.
	RoleRead
	// RoleWrite may also release, fail and resume records and retry
	// messages.
	RoleWrite
)

// String names the role: "none", "read" or "write".
func (r Role) String() string {
	switch r {
	case RoleRead:
		return "read"
	case RoleWrite:
		return "write"
	default:
		return "none"
	}
}

// MarshalText encodes the role as its name (String), as the API's
// GET /api/role answers it.
func (r Role) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// Config configures an Admin.
type Config struct {
	// Schema holds onceflow's tables; use the schema the migrations ran
	// with (and the Engine's). "" means "public".
	Schema string

	// Authorize decides each HTTP request's role: it authenticates the
	// request the way the application does (a session, an API key, a
	// client certificate) and returns RoleRead or RoleWrite. An error
	// answers 401, unless it matches ErrForbidden (403); RoleNone answers
	// 403. Required: New refuses a Config without it.
	Authorize func(*http.Request) (Role, error)

	// Engine, if set, runs the work of a record that ResumeNow released,
	// in this process, when it registers the record's workflow. nil (or a
	// workflow it does not register) leaves the released record to the
	// next retry or the completer.
	Engine *workflow.Engine

	// MaxBulk is the most records (or messages) one bulk action acts on.
	// 0 means MaxBulkDefault; at most MaxBulkLimit.
	MaxBulk int

	// Logger receives the actions taken, with the operator's reason. nil
	// discards them.
	Logger *slog.Logger
}

// withDefaults returns cfg with each zero field set to its default.
func (cfg Config) withDefaults() Config {
	cfg.MaxBulk = cmp.Or(cfg.MaxBulk, MaxBulkDefault)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return cfg
}

// validate reports a setting of cfg, with its defaults filled in, that is
// missing or out of range.
func (cfg Config) validate() error {
	if cfg.Authorize == nil {
		return fmt.Errorf("%w: admin.Config.Authorize is required: without it anyone could act on every key", ErrInvalidInput)
	}
	if cfg.MaxBulk < 0 || cfg.MaxBulk > MaxBulkLimit {
		return fmt.Errorf("%w: MaxBulk %d is out of range (0 to %d)", ErrInvalidInput, cfg.MaxBulk, MaxBulkLimit)
	}
	return nil
}

// Admin reads and acts on key records and outbox messages for operators.
type Admin struct {
	db      recovery.DBTX
	store   *recovery.Store
	ops     seam.Store
	outbox  *outbox.Outbox
	engine  *workflow.Engine
	auth    func(*http.Request) (Role, error)
	maxBulk int
	logger  *slog.Logger
}

// New returns an Admin over the onceflow tables in db (a *pgxpool.Pool).
func New(db recovery.DBTX, cfg Config) (*Admin, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	store, err := recovery.New(db, recovery.Config{Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	ob, err := outbox.New(outbox.Config{Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	return &Admin{
		db: db, store: store, ops: seam.StoreOf(store), outbox: ob, engine: cfg.Engine,
		auth: cfg.Authorize, maxBulk: cfg.MaxBulk, logger: cfg.Logger,
	}, nil
}
