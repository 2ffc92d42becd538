package workflow

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/poolgate"
	"github.com/onceflow/onceflow/internal/tracing"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
)

// MaxAttemptsDefault is how many attempts may end without finishing before
// a key fails terminally.
const MaxAttemptsDefault = 10

// DBTimeoutDefault bounds the database work done before anything runs:
// taking a connection from the pool and claiming the key.
const DBTimeoutDefault = 5 * time.Second

// DB is what the engine needs of a database: *pgxpool.Pool satisfies it.
// An atomic phase runs on one connection the engine holds, so that it can
// send the claim with its BEGIN, and the recovery point with its COMMIT, in
// one round trip each.
//
// Given a *pgxpool.Pool of MaxConns connections (two or more), the engine's
// attempts hold at most MaxConns-1 of them at once; the last is left for
// the statements that keep leases alive (renewals, hand-backs), so that a
// burst of requests queueing for connections cannot starve an attempt's
// renewals and cost it its lease. The places are the pool's, not the
// engine's: every engine and every idemhttp.Middleware with Config.Atomic
// given the same *pgxpool.Pool share them, so that together, too, they
// leave the last connection free. (A type that wraps a pool gets places of
// its own: pass the pool itself.) Size the pool for the concurrent
// attempts and Atomic requests you want plus one.
type DB interface {
	recovery.DBTX
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Config configures an Engine. The zero value is ready to use.
type Config struct {
	// Schema holds onceflow's tables; use the schema the migrations ran
	// with. "" means "public".
	Schema string

	// Lease is how long an attempt holds a key without committing progress.
	// Each commit extends it, and a step running longer than a third of it
	// has it renewed by a heartbeat; a step whose renewals all fail for a
	// whole lease is cancelled. 0 means recovery.LeaseDefault (30s).
	//
	// The first atomic phase needs no heartbeat: its uncommitted claim holds
	// the key's lock (migration 0017), and a new record is inserted only
	// when the phase commits (0019), so no one can take the key over while
	// it runs and a concurrent duplicate gets ErrInFlight at once. Keep
	// first phases short: the key is held for as long as they run, and
	// IdleTimeout, not the lease, bounds a first phase whose process went
	// silent.
	Lease time.Duration

	// IdleTimeout bounds how long the transaction of a first atomic phase
	// (or of a resumed atomic step, whose takeover it carries) may wait on
	// this process between statements: past it, PostgreSQL ends the
	// transaction, rolling the phase back, so that a process frozen or cut
	// off from the server frees the key instead of holding it until TCP
	// keepalives notice, hours by default. A live phase that waits that
	// long is ended too, and its attempt fails. A role or session that
	// sets its own idle_in_transaction_session_timeout keeps it. 0 means
	// recovery.IdleTimeoutDefault (1 minute); negative sets nothing.
	IdleTimeout time.Duration

	// MaxAttempts is how many attempts may end without finishing (an error,
	// a panic, a crash, a deadline) before the key fails terminally with a
	// stored 500. Only a caller that cancels an attempt before it did
	// anything a rollback cannot undo does not count. 0 means
	// MaxAttemptsDefault; -1 means no limit.
	MaxAttempts int

	// DBTimeout bounds taking a connection and claiming the key, the
	// database work done before any step runs: past it, Run returns an
	// error matching ErrUnavailable and runs nothing, so that a database
	// that hangs (a locked table, a host dropping packets, a full pool)
	// gives a prompt error instead of a hung request. Set the pool's
	// connect_timeout too. 0 means DBTimeoutDefault.
	//
	// Storing a definition is not bounded by it: the engine stores each
	// registered definition once, in the background (see
	// Engine.SaveDefinitions), and a run that comes before its
	// definition is stored waits for that, bounded by its own context
	// (and by the save's tries, each bounded by 30s), then claims within
	// DBTimeout. Call Engine.SaveDefinitions at start-up, before serving,
	// so that no request waits for it, and a database that does not
	// answer is found then.
	DBTimeout time.Duration

	// ResponseHeaders lists the response headers stored and replayed. nil
	// means recovery.DefaultResponseHeaders.
	ResponseHeaders []string

	// Workflows are registered at once, for Resume (see Register).
	Workflows []Definition

	// Pacing limits the calls of steps declared with foreign.Limit, by
	// downstream name, across every process sharing the database (see
	// foreign.Pace). A step whose Limit names a downstream missing here
	// fails with foreign.ErrUnknownDownstream, calling nothing. nil paces
	// nothing.
	Pacing map[string]foreign.Pace

	// DeriveKeysFrom is what downstream keys (foreign.Mutation) derive from
	// besides the tenant, the client's key and the step: the record's id
	// (foreign.FromRecord, the zero value) or nothing more
	// (foreign.FromClientKey). The record's id keeps a key reused after
	// pruning from reaching another system's memory of the first use; the
	// client's key alone keeps a record lost in a database failover (an
	// asynchronous standby promoted) from being charged again when the
	// retry makes it anew. With synchronous replication no acknowledged
	// record is lost, and the default is right; see docs/failover.md.
	// Changing it changes the keys of calls not yet made, including those
	// of records in flight: change it between deploys with no records in
	// flight, or accept that those calls go out under new keys.
	DeriveKeysFrom foreign.KeySource

	// Logger receives takeovers, step failures, retries within a step
	// (foreign.Retry), circuits opened and deferrals by pacing
	// (foreign.Limit), lost leases and terminal failures. nil discards
	// them.
	Logger *slog.Logger

	// Hooks let tests stop attempts at crash points and watch the lease
	// heartbeat. Leave nil in production.
	Hooks *Hooks

	// Observer, if set, is told of claims, step durations, retries within
	// a step, waits for a turn to call (foreign.Limit) and lost leases, for
	// metrics.
	Observer Observer

	// TracerProvider makes the engine's spans (OpenTelemetry): one per
	// attempt, and within it one for the claim, one per step, one per try
	// of a foreign call (foreign.Mutation, with the derived key as an
	// attribute; never request data) and one per compensation. A new
	// record stores its attempt's trace context, and every later attempt
	// at the key (a retry, a takeover, a completer's resume) links its span
	// to it. nil means otel.GetTracerProvider(), which makes no-op spans
	// until an SDK is installed.
	TracerProvider trace.TracerProvider

	// Clock reads the local time. nil means time.Now. The engine reads it
	// only for the step durations it tells the Observer: a lease is decided
	// by the database clock (who holds a key, until when, whether it may be
	// taken over, how long a duplicate should wait), and the heartbeat
	// measures "a whole lease without a renewal" with the runtime's
	// monotonic timers. A clock that is off, or jumps, therefore changes no
	// claim, takeover, renewal or cancellation. Tests set it to skew the
	// process's clock.
	Clock func() time.Time
}

// withDefaults returns cfg with each zero field set to its default. The
// lease, idle timeout, schema and stored headers are the store's to fill
// (recovery.Config).
func (cfg Config) withDefaults() Config {
	cfg.DBTimeout = cmp.Or(cfg.DBTimeout, DBTimeoutDefault)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, MaxAttemptsDefault)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	return cfg
}

// validate reports a setting of cfg, with its defaults filled in, that is
// out of range.
func (cfg Config) validate() error {
	if cfg.MaxAttempts < -1 {
		return fmt.Errorf("%w: MaxAttempts is %d; use -1 for no limit", ErrInvalidInput, cfg.MaxAttempts)
	}
	if cfg.DeriveKeysFrom != foreign.FromRecord && cfg.DeriveKeysFrom != foreign.FromClientKey {
		return fmt.Errorf("%w: DeriveKeysFrom is %s", ErrInvalidInput, cfg.DeriveKeysFrom)
	}
	if cfg.DBTimeout < 0 {
		return fmt.Errorf("%w: DBTimeout is %s", ErrInvalidInput, cfg.DBTimeout)
	}
	return nil
}

// Engine runs workflows under idempotency keys. It is safe for concurrent
// use; several engines, in one process or many, may share a database.
type Engine struct {
	db          DB
	gate        poolgate.Gate // keeps a connection of db's for renewals
	kept        keptConn      // a replay's connection, its transaction open (conn.go)
	store       *recovery.Store
	lease       time.Duration
	dbTimeout   time.Duration
	maxAttempts int
	keysFromKey bool // Config.DeriveKeysFrom is foreign.FromClientKey
	logger      *slog.Logger
	hooks       Hooks
	observer    Observer
	now         func() time.Time
	tracer      trace.Tracer
	pacer       phase.Pacer // nil: no Pacing

	mu        sync.RWMutex
	workflows map[string]*family
	specs     map[string]*Spec           // stored definitions read, by workflow and fingerprint
	saves     map[string]*definitionSave // saves of registered definitions, by fingerprint (definitions.go)
}

// family is every registered version of one workflow.
type family struct {
	current runnable
	byFP    map[string]runnable
	// earlier finds a version by the fingerprint an earlier release of
	// onceflow gave it (Spec.Earlier); nil when several share it (they
	// differ only in what that release did not hash), and the rules decide.
	earlier map[string]runnable
}

// lookup returns the version fingerprint names: its fingerprint, or the
// earlier one of only that version.
func (f *family) lookup(fingerprint string) (runnable, bool) {
	if d, ok := f.byFP[fingerprint]; ok {
		return d, true
	}
	d := f.earlier[fingerprint]
	return d, d != nil
}

// add registers version m.
func (f *family) add(m runnable) {
	sp := m.spec()
	f.byFP[sp.Fingerprint] = m
	if sp.Earlier == nil {
		return
	}
	if other, ok := f.earlier[sp.Earlier.Fingerprint]; ok && other != m {
		f.earlier[sp.Earlier.Fingerprint] = nil
		return
	}
	f.earlier[sp.Earlier.Fingerprint] = m
}

// Result is what a run answered.
type Result struct {
	// Response is the workflow's response: from this attempt, or stored by
	// an earlier one.
	Response Response
	// Replayed reports a response stored by an earlier attempt, returned
	// without running anything (HTTP: Idempotent-Replayed: true).
	Replayed bool
	// Outcome is how this call got the key: new, a takeover, or a replay.
	Outcome recovery.Outcome
	// ResumedFrom is the recovery point a takeover resumed after; "" when
	// the run started from the first step.
	ResumedFrom string
	// Failed reports a terminal failure: Response is the stored 500 (or an
	// Abort's response after the point of no return).
	Failed bool
	// Compensated reports a terminal failure before the point of no
	// return whose started foreign steps were undone (foreign.Compensate):
	// Response is the stored failure, an Abort's or a 500.
	Compensated bool
	// Rejected reports a Reject: Response was not stored and the key is
	// free again.
	Rejected bool
	// CompletedAt is when the replayed record finished (the database's
	// clock); the pruner may forget the key its retention after it. Zero
	// when Replayed is false.
	CompletedAt time.Time
	// FinishedFor is how long the replayed record had been finished when
	// the run read it, by the database's clock alone
	// (recovery.Record.FinishedFor): a moment of the process's clock taken
	// before the run, less FinishedFor, is the completion on that clock,
	// however far the database's clock is off. Zero when Replayed is
	// false.
	FinishedFor time.Duration
}

// NewEngine returns an engine that stores key records in db. It makes no
// round trip: it starts storing the definitions of cfg.Workflows in the
// background (see Engine.SaveDefinitions, which waits for that). With a
// nil db, the engine only lists its definitions (Specs), for a deploy
// check.
//
// Migrate db first, with `onceflow migrate up` or migrations.Migrator.Up,
// using the schema of cfg.Schema, and check it at start-up with
// migrations.Migrator.Check when another process migrates: until it is
// migrated, every Run and Resume fails with ErrNotMigrated and runs
// nothing.
func NewEngine(db DB, cfg Config) (*Engine, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	store, err := recovery.New(db, recovery.Config{
		Schema: cfg.Schema, ResponseHeaders: cfg.ResponseHeaders, Lease: cfg.Lease, IdleTimeout: cfg.IdleTimeout,
	})
	if err != nil {
		return nil, err
	}
	e := &Engine{
		db:          db,
		gate:        poolgate.For(db),
		store:       store,
		lease:       store.Lease(),
		dbTimeout:   cfg.DBTimeout,
		maxAttempts: cfg.MaxAttempts,
		keysFromKey: cfg.DeriveKeysFrom == foreign.FromClientKey,
		logger:      cfg.Logger,
		observer:    cfg.Observer,
		now:         cfg.Clock,
		tracer:      cfg.TracerProvider.Tracer(tracing.ScopeName),
		workflows:   map[string]*family{},
		specs:       map[string]*Spec{},
		saves:       map[string]*definitionSave{},
	}
	if cfg.Hooks != nil {
		e.hooks = *cfg.Hooks
	}
	if cfg.Pacing != nil {
		if e.pacer, err = e.newPacer(db, cfg.Pacing); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidInput, err)
		}
	}
	if err := e.Register(cfg.Workflows...); err != nil {
		return nil, err
	}
	return e, nil
}

// Register makes workflows resumable by this engine: Resume looks a record's
// workflow up by name, and its definition by the fingerprint the record
// stores. It starts storing each new definition in the background (see
// SaveDefinitions). Workflow.Run registers the workflow it runs. Two different
// definitions under one name are an error unless registered together with
// Versions: declare each workflow once, as a package-level value, rather
// than per call.
func (e *Engine) Register(defs ...Definition) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, d := range defs {
		members := d.versions()
		fam := e.workflows[d.Name()]
		if fam == nil {
			fam = &family{byFP: map[string]runnable{}, earlier: map[string]runnable{}}
		}
		for i, m := range members {
			sp := m.spec()
			// ResumeAs and `keys resume --as` pick a definition by its label.
			if slices.ContainsFunc(append(slices.Collect(maps.Values(fam.byFP)), members[:i]...), func(o runnable) bool {
				return o.spec().Fingerprint != sp.Fingerprint && o.spec().Version == sp.Version
			}) {
				return fmt.Errorf("%w: two definitions of workflow %q are labelled version %s; give each its own (Workflow.Version)",
					ErrInvalidInput, d.Name(), sp.Version)
			}
			if existing, ok := fam.byFP[sp.Fingerprint]; ok && existing != m {
				return fmt.Errorf("%w: two definitions of workflow %q are version %s; declare each once", ErrInvalidInput, d.Name(), sp.Version)
			}
			if _, ok := fam.byFP[sp.Fingerprint]; !ok && fam.current != nil && len(members) == 1 {
				return fmt.Errorf("%w: two workflow definitions are named %q (versions %s and %s); register both with workflow.Versions to keep the old one for the records it wrote",
					ErrInvalidInput, d.Name(), fam.current.spec().Version, sp.Version)
			}
		}
		for _, m := range members {
			fam.add(m)
			if e.db != nil { // an engine without a database only lists its definitions (Specs)
				e.saveLocked(m) // in the background, off any run's clock
			}
		}
		if len(members) > 1 || fam.current == nil {
			fam.current = members[len(members)-1]
		}
		e.workflows[d.Name()] = fam
	}
	return nil
}

// registered reports whether w itself is registered, under a read lock:
// Run registers its workflow only the first time, instead of taking the
// engine's write lock at every run.
func (e *Engine) registered(w runnable) bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	fam := e.workflows[w.spec().Workflow]
	return fam != nil && fam.byFP[w.spec().Fingerprint] == w
}

// Workflows returns the names of the registered workflows, sorted.
func (e *Engine) Workflows() []string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return slices.Sorted(maps.Keys(e.workflows))
}

// Specs returns every registered definition as data, sorted by workflow,
// each workflow's versions as registered with the current one last: what
// `onceflow workflows export` writes for a deploy check (see Diff).
func (e *Engine) Specs() []Spec {
	e.mu.RLock()
	defer e.mu.RUnlock()
	var specs []Spec
	for _, name := range slices.Sorted(maps.Keys(e.workflows)) {
		fam := e.workflows[name]
		cur := fam.current.spec()
		for _, fp := range slices.Sorted(maps.Keys(fam.byFP)) {
			if fp != cur.Fingerprint {
				specs = append(specs, fam.byFP[fp].spec())
			}
		}
		specs = append(specs, cur)
	}
	return specs
}

// definitionFor returns the registered definition that runs rec: the one
// an operator chose for it (Record.ResumeAs), else the one with the
// record's fingerprint, or the earlier fingerprint of only one of them
// (Spec.Earlier), else the workflow's current one.
func (e *Engine) definitionFor(rec *recovery.Record) (runnable, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	fam, ok := e.workflows[rec.Workflow]
	if !ok {
		return nil, false
	}
	if d, ok := fam.lookup(cmp.Or(rec.ResumeAs, rec.Definition)); ok {
		return d, true
	}
	return fam.current, true
}

// Store returns the engine's key-record store, for inspection and for
// operations outside workflows (ExpireLease in tests, for example).
func (e *Engine) Store() *recovery.Store { return e.store }

// Run runs w for req under key on e and returns its response. The request
// type is w's own, so a request of another type does not compile.
//
// A new key runs the workflow from its first step. A key whose workflow
// finished returns the stored response with Replayed set, running nothing.
// A key whose previous attempt stopped (its lease expired or was released)
// is taken over and resumed after its recovery point. A key in flight
// returns an error matching ErrInFlight; the same key with a different
// request, ErrMismatch.
//
// A key whose record another principal made (see AsPrincipal) returns an
// error matching ErrForbidden, running nothing and telling nothing of the
// record.
//
// If ctx is cancelled mid-way, the attempt stops, hands its lease back and
// returns the context's error; a retry or [Engine.Resume] finishes the
// work. Run registers w with e (see [Engine.Register]).
func (w *Workflow[Req, State]) Run(ctx context.Context, e *Engine, key Key, req Req, opts ...RunOption) (*Result, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	if !e.registered(w) {
		if err := e.Register(w); err != nil {
			return nil, err
		}
	}
	var o runOptions
	for _, opt := range opts {
		opt(&o)
	}
	res, err := w.run(ctx, e, key, req, o)
	e.resetIfReadOnly(ctx, w.name, err)
	return res, err
}

// resetIfReadOnly resets the engine's pool when err is a write a read-only
// server refused (recovery.ResetIfReadOnly): a failover left the pool's
// connections on a standby. The error stays the caller's to see; it
// matches recovery.Unavailable (HTTP 503). A foreign step's own failure
// does not reset it: a database that refused the step's write there is
// another one, and resetting the engine's pool for it would reopen every
// connection at each such failure.
func (e *Engine) resetIfReadOnly(ctx context.Context, workflow string, err error) {
	if stepErr := (*StepError)(nil); errors.As(err, &stepErr) && stepErr.Foreign {
		return
	}
	if recovery.ResetIfReadOnly(e.db, err) {
		e.logger.WarnContext(ctx, "the database refused a write as read-only (a standby, after a failover?); the pool's connections were closed",
			slog.String("workflow", workflow), slog.Any("error", err))
	}
}

// RunOption changes how Workflow.Run treats one request.
type RunOption func(*runOptions)

type runOptions struct {
	principal string
}

// AsPrincipal runs the request on behalf of principal, the caller within
// the key's tenant (a user, an API client): a new record remembers it (as a
// hash), and a run of the same key by any other principal gets
// ErrForbidden instead of the stored response. Without it, or with "", the
// principal is the tenant itself. Pass the principal your authentication
// established, never one the client states.
func AsPrincipal(principal string) RunOption {
	return func(o *runOptions) { o.principal = principal }
}

// Resume finishes the work of a key whose client is gone, from the stored
// request: it takes over the expired lease and continues after the recovery
// point, as a retry would. The record's workflow must be registered (Config
// Workflows, Register, or an earlier Run). A finished key returns its stored
// response; a key in flight, ErrInFlight; a missing one, ErrNotFound.
func (e *Engine) Resume(ctx context.Context, key Key) (*Result, error) {
	rec, err := e.store.Load(ctx, key)
	if err != nil {
		return nil, err
	}
	if rec.Finished() {
		return replayed(rec), nil
	}
	wf, ok := e.definitionFor(rec)
	if !ok {
		return nil, fmt.Errorf("resume key %q of tenant %q: %w %q", key.ID, key.Tenant, ErrUnknownWorkflow, rec.Workflow)
	}
	res, err := wf.resume(ctx, e, rec, 0)
	e.resetIfReadOnly(ctx, rec.Workflow, err)
	return res, err
}

// replayed is the result of a finished record.
func replayed(rec *recovery.Record) *Result {
	return &Result{
		Response:    *rec.Response,
		Replayed:    true,
		Outcome:     recovery.OutcomeReplay,
		Failed:      rec.Status == recovery.StatusFailed,
		Compensated: rec.Status == recovery.StatusCompensated,
		CompletedAt: rec.CompletedAt,
		FinishedFor: rec.FinishedFor,
	}
}
