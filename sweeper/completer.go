package sweeper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/dbschema"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// Defaults for CompleterConfig.
const (
	CompleteBatchDefault   = 100
	ConcurrencyDefault     = 4
	ResumeTimeoutDefault   = 5 * time.Minute
	BackoffBaseDefault     = time.Second
	BackoffMaxDefault      = time.Hour
	completerReportTimeout = 10 * time.Second
)

// CompleterConfig configures a Completer.
type CompleterConfig struct {
	// Schema holds onceflow's tables, for a completer without an engine;
	// "" means "public". A completer with an engine reads the engine's
	// schema: leave it "" then (NewCompleter refuses another schema).
	Schema string

	// BatchSize is how many records one run resumes at most. 0 means
	// CompleteBatchDefault.
	BatchSize int

	// Concurrency is how many records are resumed at once. 0 means
	// ConcurrencyDefault.
	Concurrency int

	// BackoffBase and BackoffMax space out resumptions of a record that
	// keeps failing: it is resumed no sooner than BackoffBase × 2^attempts
	// (at most BackoffMax) after its last update. 0 means BackoffBaseDefault
	// (1s) and BackoffMaxDefault (1h); a negative BackoffBase resumes every
	// expired record at once.
	BackoffBase time.Duration
	BackoffMax  time.Duration

	// ResumeTimeout bounds one resumption, so that a hung step cannot hold
	// up the run. 0 means ResumeTimeoutDefault.
	ResumeTimeout time.Duration

	Logger   *slog.Logger
	Observer Observer
}

// withDefaults returns cfg with each zero field set to its default.
func (cfg CompleterConfig) withDefaults() CompleterConfig {
	cfg.Schema = cmp.Or(cfg.Schema, dbschema.Default)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, CompleteBatchDefault)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, ConcurrencyDefault)
	cfg.BackoffBase = cmp.Or(cfg.BackoffBase, BackoffBaseDefault)
	cfg.BackoffMax = cmp.Or(cfg.BackoffMax, BackoffMaxDefault)
	cfg.ResumeTimeout = cmp.Or(cfg.ResumeTimeout, ResumeTimeoutDefault)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	return cfg
}

// validate reports a setting of cfg, with its defaults filled in, that is
// out of range.
func (cfg CompleterConfig) validate() error {
	if _, err := dbschema.Resolve(cfg.Schema); err != nil {
		return err
	}
	if cfg.BatchSize < 0 || cfg.Concurrency < 0 || cfg.ResumeTimeout < 0 {
		return errors.New("sweeper: completer batch size, concurrency and resume timeout must be positive")
	}
	return nil
}

// Completer finishes work whose client went away: it finds records in
// flight whose lease expired, takes each over (fenced, with a new owner
// token) and resumes it through the engine's registered workflows. Records
// of workflows the engine does not know are reported, not touched.
//
// Parked records (recovery.StatusParked: a changed definition may not
// resume them) are never picked: they hold no lease and wait for an
// operator. Each run counts them per workflow, for the observer
// (Observer.ParkedRecords) and, when a count changes to a number above
// zero, a Warn log.
//
// A record is due when its backoff has passed and its lease has ended:
// run out (its process stopped) or handed back (its attempt failed), and,
// when its last attempt deferred it (recovery.Record.NotBefore), once that
// time has come. Each
// run resumes at most BatchSize due records, in turns across tenants: the
// longest-due record of every tenant, then the second of every tenant, and
// so on; within a turn, the longest-due first. So records that keep
// failing, however many one tenant has, cannot hold back another tenant's
// crashed work, and within a tenant none waits behind records that became
// due after it.
type Completer struct {
	db       DBTX
	schema   string
	engine   *workflow.Engine
	cfg      CompleterConfig
	sql      completerSQL
	logger   *slog.Logger
	observer Observer

	mu        sync.Mutex
	abandoned map[string]int  // abandoned records per workflow, as last reported
	parked    map[string]int  // parked records per workflow, as last reported
	stuck     map[string]bool // workflows last reported with a stuck record
}

type completerSQL struct{ due, abandoned, parked, oldest, stuck string }

// NewCompleter returns a completer that resumes through engine, in the
// engine's schema. With a nil engine it only reports abandoned records and
// the oldest one in flight, in cfg.Schema, for deployments whose workflows
// live in another binary.
func NewCompleter(db DBTX, engine *workflow.Engine, cfg CompleterConfig) (*Completer, error) {
	if engine != nil {
		schema := engine.Store().Schema()
		if cfg.Schema != "" && cfg.Schema != schema {
			return nil, fmt.Errorf("sweeper: CompleterConfig.Schema is %q but the engine's schema is %q: a completer with an engine uses the engine's; leave it empty",
				cfg.Schema, schema)
		}
		cfg.Schema = schema
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	schema := cfg.Schema
	return &Completer{
		db:     db,
		schema: schema,
		engine: engine,
		cfg:    cfg,
		sql: completerSQL{
			due:       dbschema.Expand(dueSQL, schema),
			abandoned: dbschema.Expand(abandonedSQL, schema),
			parked:    dbschema.Expand(parkedSQL, schema),
			oldest:    dbschema.Expand(oldestSQL, schema),
			stuck:     dbschema.Expand(oldestStuckSQL, schema),
		},
		logger:    cfg.Logger,
		observer:  cfg.Observer,
		abandoned: map[string]int{},
		parked:    map[string]int{},
		stuck:     map[string]bool{},
	}, nil
}

// Name is "completer".
func (c *Completer) Name() string { return "completer" }

// dueSQL picks the batch of records of known workflows to resume, fairly
// (see Completer). A record is due at the latest of the end of its lease
// ('-infinity' for a lease handed back), its last update plus the backoff
// (the doubling stops at 2^30, far past any cap) and its deferral
// (not_before; greatest skips it when NULL, and the takeover would refuse
// a record before it anyway). It ranks the due records within each tenant
// by due time, and takes the first of every tenant before the second of
// any, each rank in due order. Ranking reads
// every due record in flight: the partial index onceflow_keys_in_flight_idx
// keeps that to the records in flight, not the table. $1 workflows, $2
// backoff base and $3 backoff cap in microseconds, $4 limit.
const dueSQL = `
SELECT tenant_id, key, workflow FROM (
    SELECT tenant_id, key, workflow, due_at,
           row_number() OVER (PARTITION BY tenant_id ORDER BY due_at, key) AS turn
    FROM (
        SELECT tenant_id, key, workflow, greatest(locked_until, updated_at
                   + least($2::bigint * power(2, least(attempts, 30)), $3::bigint) * interval '1 microsecond',
                   not_before) AS due_at
        FROM {schema}.onceflow_keys
        WHERE status = 'in_flight' AND locked_until < clock_timestamp() AND workflow = ANY($1)
    ) expired
    WHERE due_at <= clock_timestamp()
) due
ORDER BY turn, due_at, tenant_id, key
LIMIT $4`

// abandonedSQL counts expired records no known workflow can resume.
const abandonedSQL = `
SELECT workflow, count(*) FROM {schema}.onceflow_keys
WHERE status = 'in_flight' AND locked_until < clock_timestamp() AND NOT (workflow = ANY($1))
GROUP BY workflow`

// parkedSQL counts parked records per workflow. The partial index
// onceflow_keys_parked_idx holds exactly the parked records, so the count
// reads those, however many others the table has.
const parkedSQL = `
SELECT workflow, count(*) FROM {schema}.onceflow_keys WHERE status = 'parked' GROUP BY workflow`

const oldestSQL = `
SELECT coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8
FROM {schema}.onceflow_keys WHERE status = 'in_flight'`

// oldestStuckSQL is, per workflow, the age of the oldest stuck record: in
// flight (compensating included) and held by no attempt, its lease run out
// or handed back (deferred ones too), so that nothing moves it until a
// retry or a completer takes it over. The age counts from its creation:
// how long its client has waited for an answer. Like dueSQL, it reads
// through onceflow_keys_in_flight_idx.
const oldestStuckSQL = `
SELECT workflow, extract(epoch FROM clock_timestamp() - min(created_at))::float8
FROM {schema}.onceflow_keys
WHERE status = 'in_flight' AND locked_until < clock_timestamp()
GROUP BY workflow`

// Run reports what it cannot resume (abandoned and parked records) and the
// age of the oldest record in flight, then resumes one batch of due
// records.
func (c *Completer) Run(ctx context.Context) error {
	var known []string
	if c.engine != nil {
		known = c.engine.Workflows()
	}
	errs := []error{c.report(ctx, known)}
	if len(known) > 0 {
		errs = append(errs, c.resumeDue(ctx, known))
	}
	return errors.Join(errs...)
}

func (c *Completer) resumeDue(ctx context.Context, known []string) error {
	base := c.cfg.BackoffBase
	if base < 0 {
		base = 0
	}
	rows, err := c.db.Query(ctx, c.sql.due, known, base.Microseconds(), c.cfg.BackoffMax.Microseconds(), c.cfg.BatchSize)
	if err != nil {
		return fmt.Errorf("find expired records: %w", recovery.NotMigrated(c.schema, err))
	}
	due, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (dueRecord, error) {
		var d dueRecord
		return d, row.Scan(&d.key.Tenant, &d.key.ID, &d.workflow)
	})
	if err != nil {
		return fmt.Errorf("find expired records: %w", recovery.NotMigrated(c.schema, err))
	}
	var (
		wg  sync.WaitGroup
		sem = make(chan struct{}, c.cfg.Concurrency)
	)
	for _, d := range due {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			c.resume(ctx, d)
		})
	}
	wg.Wait()
	return nil
}

// dueRecord is an expired record the completer will resume.
type dueRecord struct {
	key      workflow.Key
	workflow string
}

func (c *Completer) resume(ctx context.Context, d dueRecord) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ResumeTimeout)
	defer cancel()
	res, err := c.engine.Resume(ctx, d.key)
	attrs := []any{slog.String("workflow", d.workflow), slog.String("tenant", d.key.Tenant), slog.String("key", d.key.ID)}
	switch {
	case errors.Is(err, workflow.ErrInFlight), errors.Is(err, workflow.ErrNotFound):
		return // another sweeper or a client retry got there first
	case errors.Is(err, workflow.ErrParked):
		// The engine parked it (and logged why); report counts it from now on.
	case err != nil:
		c.logger.WarnContext(ctx, "could not complete an abandoned record", append(attrs, slog.Any("error", err))...)
	case res.Replayed:
		return
	case res.Failed:
		err = errors.New("failed terminally")
		c.logger.WarnContext(ctx, "an abandoned record failed terminally", attrs...)
	default:
		c.logger.InfoContext(ctx, "completed an abandoned record",
			append(attrs, slog.String("after", res.ResumedFrom), slog.Int("status", res.Response.Status))...)
	}
	if c.observer != nil {
		c.observer.Resumed(d.workflow, err)
	}
}

// report tells the observer and the log about records no known workflow can
// resume, about parked records, about the oldest record in flight, and
// about each workflow's oldest stuck record.
func (c *Completer) report(ctx context.Context, known []string) error {
	ctx, cancel := context.WithTimeout(ctx, completerReportTimeout)
	defer cancel()
	if known == nil {
		known = []string{}
	}
	abandoned, err := c.countPerWorkflow(ctx, c.sql.abandoned, known)
	if err != nil {
		return fmt.Errorf("count abandoned records: %w", err)
	}
	parked, err := c.countPerWorkflow(ctx, c.sql.parked)
	if err != nil {
		return fmt.Errorf("count parked records: %w", err)
	}
	c.mu.Lock()
	c.reportCounts(ctx, c.abandoned, abandoned, "abandoned records of a workflow this sweeper cannot resume", c.observeAbandoned)
	c.reportCounts(ctx, c.parked, parked, "parked records wait for an operator: onceflow keys list --status parked",
		c.observeParked)
	c.mu.Unlock()

	var seconds float64
	if err := c.db.QueryRow(ctx, c.sql.oldest).Scan(&seconds); err != nil {
		return fmt.Errorf("age of the oldest record in flight: %w", recovery.NotMigrated(c.schema, err))
	}
	if c.observer != nil {
		c.observer.OldestInFlight(time.Duration(seconds * float64(time.Second)))
	}
	return c.reportStuck(ctx)
}

// reportStuck tells the observer the age of each workflow's oldest stuck
// record (oldestStuckSQL), and 0 for a workflow last reported that has
// none left.
func (c *Completer) reportStuck(ctx context.Context) error {
	rows, err := c.db.Query(ctx, c.sql.stuck)
	if err != nil {
		return fmt.Errorf("age of the oldest stuck record: %w", recovery.NotMigrated(c.schema, err))
	}
	ages := map[string]time.Duration{}
	var (
		name    string
		seconds float64
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &seconds}, func() error {
		ages[name] = time.Duration(seconds * float64(time.Second))
		return nil
	}); err != nil {
		return fmt.Errorf("age of the oldest stuck record: %w", recovery.NotMigrated(c.schema, err))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range c.stuck {
		if _, still := ages[name]; !still {
			c.observeStuck(name, 0)
			delete(c.stuck, name)
		}
	}
	for name, age := range ages {
		c.stuck[name] = true
		c.observeStuck(name, age)
	}
	return nil
}

func (c *Completer) observeStuck(name string, age time.Duration) {
	if c.observer != nil {
		c.observer.OldestStuck(name, age)
	}
}

// countPerWorkflow runs sql, which returns (workflow, count) rows.
func (c *Completer) countPerWorkflow(ctx context.Context, sql string, args ...any) (map[string]int, error) {
	rows, err := c.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, recovery.NotMigrated(c.schema, err)
	}
	counts := map[string]int{}
	var (
		name string
		n    int
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error { counts[name] = n; return nil }); err != nil {
		return nil, recovery.NotMigrated(c.schema, err)
	}
	return counts, nil
}

// reportCounts observes each workflow's count, 0 for a workflow last
// reported that has none left, logs msg at Warn for each count that
// changed (not every run), and keeps the counts in last. c.mu is held.
func (c *Completer) reportCounts(ctx context.Context, last, counts map[string]int, msg string, observe func(string, int)) {
	for name, n := range counts {
		if last[name] != n {
			c.logger.WarnContext(ctx, msg, slog.String("workflow", name), slog.Int("records", n))
		}
		observe(name, n)
		last[name] = n
	}
	for name := range last {
		if _, still := counts[name]; !still {
			observe(name, 0)
			delete(last, name)
		}
	}
}

func (c *Completer) observeAbandoned(name string, n int) {
	if c.observer != nil {
		c.observer.Abandoned(name, n)
	}
}

func (c *Completer) observeParked(name string, n int) {
	if c.observer != nil {
		c.observer.ParkedRecords(name, n)
	}
}
