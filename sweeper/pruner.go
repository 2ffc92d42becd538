package sweeper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/dbschema"
	"github.com/onceflow/onceflow/recovery"
)

// Defaults for PrunerConfig.
const (
	RetentionDefault    = recovery.RetentionDefault
	PruneBatchDefault   = 1000
	QueryTimeoutDefault = 10 * time.Second
	PauseDefault        = 100 * time.Millisecond
	minPruneBatch       = 10
	// maxTimeouts is how many statements in a row may time out at the
	// smallest batch before a run gives up until its next turn.
	maxTimeouts = 3
)

// DBTX runs statements; *pgxpool.Pool satisfies it. It is recovery.DBTX.
type DBTX = recovery.DBTX

// PrunerConfig configures a Pruner.
type PrunerConfig struct {
	// Schema holds onceflow's tables; "" means "public".
	Schema string

	// Retention is how long a completed or failed record is kept after it
	// finished, so that retries keep getting its response. 0 means
	// RetentionDefault (24h). A key reused after its record was pruned is a
	// new request. The HTTP middleware advertises it to clients
	// (idemhttp.Config.KeyLifetime): keep the two equal.
	Retention time.Duration

	// OutboxRetention is how long a delivered outbox message is kept. 0
	// means Retention; -1 keeps them. Dead messages are always kept.
	OutboxRetention time.Duration

	// ProcessedRetention is how long a consumer's record of a processed
	// message (outbox.Process) is kept. 0 means OutboxRetention; -1 keeps
	// them. A record older than this is deleted only when no redelivery of
	// its message can come from this schema's outbox: no message with its
	// dedupe key is pending, or dead (an operator may revive it with
	// onceflow outbox retry). For consumers of messages relayed from another
	// database, which this check cannot see, make it longer than a message
	// may wait there. A message enqueued with the dedupe key after both it
	// and the record are pruned is a new effect.
	ProcessedRetention time.Duration

	// AbandonedRetention, when positive, also deletes keys in flight that
	// store no request (the HTTP middleware's claims, which nothing can
	// resume) whose lease ended longer ago than this: their client gave up,
	// and a retry after that is a new request, as after Retention. 0 keeps
	// them, for an operator to see (onceflow keys list --stuck-for).
	// Workflow keys, which store their request, are never deleted in flight.
	// Keep idemhttp.Config.KeyLifetime no longer than it.
	AbandonedRetention time.Duration

	// BatchSize is how many rows one statement deletes at most. 0 means
	// PruneBatchDefault. After a statement times out, the pruner halves it
	// (down to 10) for the rest of the run.
	BatchSize int

	// QueryTimeout bounds each statement. 0 means QueryTimeoutDefault.
	QueryTimeout time.Duration

	// Pause is the wait between batches, with ±50% jitter, to leave room
	// for the database's other work. 0 means PauseDefault; -1 means none.
	Pause time.Duration

	Logger   *slog.Logger
	Observer Observer
}

// withDefaults returns cfg with each zero field set to its default.
func (cfg PrunerConfig) withDefaults() PrunerConfig {
	cfg.Schema = cmp.Or(cfg.Schema, dbschema.Default)
	cfg.Retention = cmp.Or(cfg.Retention, RetentionDefault)
	cfg.OutboxRetention = cmp.Or(cfg.OutboxRetention, cfg.Retention)
	cfg.ProcessedRetention = cmp.Or(cfg.ProcessedRetention, cfg.OutboxRetention)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, PruneBatchDefault)
	cfg.QueryTimeout = cmp.Or(cfg.QueryTimeout, QueryTimeoutDefault)
	cfg.Pause = cmp.Or(cfg.Pause, PauseDefault)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	return cfg
}

// validate reports a setting of cfg, with its defaults filled in, that is
// out of range.
func (cfg PrunerConfig) validate() error {
	if _, err := dbschema.Resolve(cfg.Schema); err != nil {
		return err
	}
	if cfg.Retention < 0 || cfg.BatchSize < 0 || cfg.QueryTimeout < 0 {
		return errors.New("sweeper: pruner retention, batch size and query timeout must be positive")
	}
	return nil
}

// Pruner deletes records that finished longer ago than the retention, in
// bounded, time-boxed batches. It never touches a record in flight, nor a
// parked one.
type Pruner struct {
	db         DBTX
	schema     string
	cfg        PrunerConfig
	statements []pruneStatement
	logger     *slog.Logger
	observer   Observer
}

// pruneStatement deletes a batch of rows of table older than retention.
type pruneStatement struct {
	table, sql string
	retention  time.Duration
}

// NewPruner returns a pruner.
func NewPruner(db DBTX, cfg PrunerConfig) (*Pruner, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	schema := cfg.Schema
	return &Pruner{
		db:         db,
		schema:     schema,
		cfg:        cfg,
		statements: pruneStatements(cfg, schema),
		logger:     cfg.Logger,
		observer:   cfg.Observer,
	}, nil
}

// pruneStatements lists what a run prunes, in order, leaving out what cfg
// keeps.
func pruneStatements(cfg PrunerConfig, schema string) []pruneStatement {
	all := []pruneStatement{
		{"onceflow_keys", pruneKeysSQL, cfg.Retention},
		{"onceflow_keys", pruneAbandonedSQL, cfg.AbandonedRetention},
		{"onceflow_outbox", pruneOutboxSQL, cfg.OutboxRetention},
		{"onceflow_processed", pruneProcessedSQL, cfg.ProcessedRetention},
	}
	var kept []pruneStatement
	for _, st := range all {
		if st.retention > 0 {
			st.sql = dbschema.Expand(st.sql, schema)
			kept = append(kept, st)
		}
	}
	return kept
}

// Name is "pruner".
func (p *Pruner) Name() string { return "pruner" }

// The prune statements share two habits, both for the planner:
//
//   - Their cut-off is statement_timestamp(), not clock_timestamp(): a
//     stable value can bound the index scan (an Index Cond), so the last
//     batch of a run stops at the cut-off instead of reading every row
//     finished since. A few milliseconds of clock do not matter here.
//   - They lock a batch FOR UPDATE SKIP LOCKED (rows another pruner holds
//     are skipped) and delete the rows they locked by ctid, a TID scan.
//     Joining the batch back by key let the planner read the table whole
//     to hash it, once a batch.
//
// A row updated after the statement's snapshot has a ctid the delete does
// not see, so it is left alone for a later batch.

// pruneKeysSQL deletes a batch of records finished (completed or failed)
// before the retention. A finished record never changes status again, and
// the delete says so again. It names the finished statuses rather than
// "not in flight": a parked record is not finished, it waits for an
// operator, and is never pruned. The list of statuses implies the
// predicate of onceflow_keys_finished_idx (status <> 'in_flight'), so the
// index still serves it.
const pruneKeysSQL = `
DELETE FROM {schema}.onceflow_keys WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {schema}.onceflow_keys
    WHERE status IN ('completed', 'failed', 'compensated') AND completed_at < statement_timestamp() - $1::bigint * interval '1 microsecond'
    ORDER BY completed_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)) AND status IN ('completed', 'failed', 'compensated')`

// pruneOutboxSQL deletes a batch of messages delivered before the
// retention. A delivered message never changes again.
const pruneOutboxSQL = `
DELETE FROM {schema}.onceflow_outbox WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {schema}.onceflow_outbox
    WHERE status = 'delivered' AND delivered_at < statement_timestamp() - $1::bigint * interval '1 microsecond'
    ORDER BY delivered_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))`

// pruneProcessedSQL deletes a batch of consumers' records of processed
// messages older than the retention whose message no relay can deliver
// again: none with the dedupe key is pending or dead (a dedupe key is
// unique per topic only, and a record does not say its topic, so a message
// of any topic keeps it). A delivered message never goes back, so what the
// check sees stays true until the delete commits.
const pruneProcessedSQL = `
DELETE FROM {schema}.onceflow_processed WHERE ctid = ANY (ARRAY(
    SELECT p.ctid FROM {schema}.onceflow_processed p
    WHERE p.processed_at < statement_timestamp() - $1::bigint * interval '1 microsecond'
      AND NOT EXISTS (
          SELECT FROM {schema}.onceflow_outbox o
          WHERE o.dedupe_key = p.dedupe_key AND o.status <> 'delivered')
    ORDER BY p.processed_at
    LIMIT $2
    FOR UPDATE OF p SKIP LOCKED
))`

// pruneAbandonedSQL deletes a batch of request-less keys in flight whose
// lease ended before the cut-off (see AbandonedRetention), checked again
// at delete time. It compares a lease, so with clock_timestamp(), as lease
// arithmetic does everywhere; locked_until is not indexed anyway.
const pruneAbandonedSQL = `
DELETE FROM {schema}.onceflow_keys WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {schema}.onceflow_keys
    WHERE status = 'in_flight' AND request IS NULL
      AND locked_until < clock_timestamp() - $1::bigint * interval '1 microsecond'
    ORDER BY created_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)) AND status = 'in_flight' AND request IS NULL
  AND locked_until < clock_timestamp() - $1::bigint * interval '1 microsecond'`

// Run prunes until nothing is due, ctx ends, or a statement fails other
// than by timing out.
func (p *Pruner) Run(ctx context.Context) error {
	for _, st := range p.statements {
		if _, err := p.prune(ctx, st.table, st.sql, st.retention); err != nil {
			return err
		}
	}
	return nil
}

func (p *Pruner) prune(ctx context.Context, table, sql string, retention time.Duration) (int, error) {
	total, batch, timeouts := 0, p.cfg.BatchSize, 0
	for ctx.Err() == nil {
		qctx, cancel := context.WithTimeout(ctx, p.cfg.QueryTimeout)
		tag, err := p.db.Exec(qctx, sql, retention.Microseconds(), batch)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && timedOut(err):
			if batch == minPruneBatch {
				if timeouts++; timeouts >= maxTimeouts {
					return total, fmt.Errorf("prune %s: %d batches of %d timed out in a row: %w", table, timeouts, batch, err)
				}
			}
			batch = max(batch/2, minPruneBatch)
			p.logger.WarnContext(ctx, "prune batch timed out; smaller batches from now on",
				slog.String("table", table), slog.Int("batch", batch))
		case err != nil:
			return total, fmt.Errorf("prune %s: %w", table, recovery.NotMigrated(p.schema, err))
		default:
			timeouts = 0
			n := int(tag.RowsAffected())
			total += n
			if p.observer != nil && n > 0 {
				p.observer.Pruned(table, n)
			}
			if n < batch {
				if total > 0 {
					p.logger.InfoContext(ctx, "pruned", slog.String("table", table), slog.Int("rows", total))
				}
				return total, nil
			}
		}
		p.pause(ctx)
	}
	return total, ctx.Err()
}

// pause waits about cfg.Pause, jittered, or until ctx ends.
func (p *Pruner) pause(ctx context.Context) {
	if p.cfg.Pause <= 0 {
		return
	}
	wait := time.Duration(float64(p.cfg.Pause) * (0.5 + rand.Float64()))
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// timedOut reports a statement ended by its timeout: a context deadline on
// the client, or PostgreSQL's query_canceled.
func timedOut(err error) bool {
	var pgErr *pgconn.PgError
	return pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &pgErr) && pgErr.Code == "57014")
}
