package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/dbschema"
)

// Defaults for RelayConfig.
const (
	BatchSizeDefault   = 100
	LeaseDefault       = time.Minute
	MaxAttemptsDefault = 10
	// maxBatchesPerRun keeps one RunOnce from running forever while
	// messages keep arriving; the next run continues.
	maxBatchesPerRun = 100
)

// Handler delivers one message. Returning an error (or panicking) schedules
// a retry. It may be called more than once for a message: make the effect
// once with Outbox.Process.
type Handler func(ctx context.Context, m *Record) error

// Observer is told what a relay did, for metrics. Its methods must be safe
// for concurrent use.
type Observer interface {
	Delivered(topic string)
	Retried(topic string)
	Dead(topic string)
}

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Schema holds onceflow's tables; "" means "public".
	Schema string

	// Handlers deliver messages by topic. The relay takes only messages of
	// these topics; others wait for a relay that has their handler.
	Handlers map[string]Handler

	// BatchSize is how many messages one take hides. 0 means
	// BatchSizeDefault.
	BatchSize int

	// Lease is how long a taken message stays hidden from other relays. A
	// relay that dies leaves its batch to be taken again after it. 0 means
	// LeaseDefault.
	Lease time.Duration

	// HandlerTimeout bounds one delivery. 0 means half the lease. A
	// delivery also ends before its batch's lease does: when too little of
	// the lease is left, the rest of the batch is given back rather than
	// delivered late, while another relay may take it.
	HandlerTimeout time.Duration

	// MaxAttempts is how many deliveries may fail before the message is
	// dead-lettered. 0 means MaxAttemptsDefault.
	MaxAttempts int

	// Backoff is the wait before retrying after the n-th failed attempt. nil
	// means Backoff: exponential from one second, at most an hour, with
	// jitter.
	Backoff func(attempt int) time.Duration

	// Logger receives failed and dead deliveries. nil discards them.
	Logger *slog.Logger

	// Observer, if set, is told of every outcome.
	Observer Observer
}

// withDefaults returns cfg with each zero field set to its default.
func (cfg RelayConfig) withDefaults() RelayConfig {
	cfg.Schema = cmp.Or(cfg.Schema, dbschema.Default)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, BatchSizeDefault)
	cfg.Lease = cmp.Or(cfg.Lease, LeaseDefault)
	cfg.HandlerTimeout = cmp.Or(cfg.HandlerTimeout, cfg.Lease/2)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, MaxAttemptsDefault)
	if cfg.Backoff == nil {
		cfg.Backoff = Backoff
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	return cfg
}

// validate reports a setting of cfg, with its defaults filled in, that is
// out of range, or a relay with no handler.
func (cfg RelayConfig) validate() error {
	if _, err := dbschema.Resolve(cfg.Schema); err != nil {
		return err
	}
	if len(cfg.Handlers) == 0 {
		return fmt.Errorf("%w: a relay needs at least one handler", ErrInvalidInput)
	}
	if cfg.BatchSize < 0 || cfg.Lease < time.Millisecond || cfg.MaxAttempts < 1 ||
		cfg.HandlerTimeout <= 0 || cfg.HandlerTimeout > cfg.Lease {
		return fmt.Errorf("%w: relay batch size, lease, handler timeout (at most the lease) and max attempts must be positive",
			ErrInvalidInput)
	}
	return nil
}

// Backoff is the default retry wait after the attempt-th failure: one second
// doubled per attempt, at most an hour, within ±20% at random so that
// failures spread out.
func Backoff(attempt int) time.Duration {
	wait := time.Hour
	if attempt < 13 {
		wait = min(time.Second<<max(attempt-1, 0), time.Hour)
	}
	jitter := 0.8 + 0.4*rand.Float64()
	return time.Duration(float64(wait) * jitter)
}

// Relay delivers messages at least once.
type Relay struct {
	db     DBTX
	cfg    RelayConfig
	topics []string
	sql    *queries
	logger *slog.Logger
}

// Stats counts what one run did.
type Stats struct {
	Delivered, Retried, Dead int
}

// NewRelay returns a relay for the topics in cfg.Handlers.
func NewRelay(db DBTX, cfg RelayConfig) (*Relay, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Relay{
		db:     db,
		cfg:    cfg,
		topics: slices.Sorted(maps.Keys(cfg.Handlers)),
		sql:    newQueries(cfg.Schema),
		logger: cfg.Logger,
	}, nil
}

// RunOnce delivers due messages, batch after batch, until none is due (or
// a bounded number of batches ran). If ctx ends mid-batch, the messages not
// yet delivered are made available again at once.
func (r *Relay) RunOnce(ctx context.Context) (Stats, error) {
	var stats Stats
	for range maxBatchesPerRun {
		b, err := r.take(ctx)
		if err != nil {
			return stats, err
		}
		for i := range b.messages {
			if ctx.Err() != nil {
				r.giveBack(b, b.messages[i:])
				return stats, ctx.Err()
			}
			if b.left() < r.cfg.Lease/10 {
				// Too late to deliver within the lease: let a relay take
				// these again rather than deliver them twice.
				r.giveBack(b, b.messages[i:])
				break
			}
			r.deliver(ctx, b, &b.messages[i], &stats)
		}
		if len(b.messages) < r.cfg.BatchSize {
			return stats, nil
		}
	}
	return stats, nil
}

// batch is one take: its messages, its token and when its lease ends.
type batch struct {
	messages []Record
	token    uuid.UUID
	deadline time.Time // local clock, a little before the database's lease end
}

// left is how much of the batch's lease remains.
func (b *batch) left() time.Duration { return time.Until(b.deadline) }

func (r *Relay) take(ctx context.Context) (*batch, error) {
	// The deadline is taken before the statement runs, so it falls before
	// the lease the database grants.
	b := &batch{token: uuid.New(), deadline: time.Now().Add(r.cfg.Lease)}
	rows, err := r.db.Query(ctx, r.sql.take, r.cfg.BatchSize, r.cfg.Lease.Microseconds(), r.topics, b.token)
	if err != nil {
		return nil, fmt.Errorf("take outbox batch: %w", err)
	}
	b.messages, err = pgx.CollectRows(rows, scanRecord)
	if err != nil {
		return nil, fmt.Errorf("take outbox batch: %w", err)
	}
	slices.SortFunc(b.messages, func(x, y Record) int { return cmp.Compare(x.ID, y.ID) })
	return b, nil
}

// deliver hands m to its handler and records the outcome under the batch's
// token. An outcome that matches no row (the lease ran out, another relay
// took the message) is dropped and not counted.
func (r *Relay) deliver(ctx context.Context, b *batch, m *Record, stats *Stats) {
	err := r.call(ctx, m, min(r.cfg.HandlerTimeout, b.left()))
	if err != nil && ctx.Err() != nil {
		r.giveBack(b, []Record{*m}) // the relay is stopping, not the handler failing
		return
	}
	// The outcome is written even if ctx ended meanwhile.
	writeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	attrs := []any{slog.Int64("id", m.ID), slog.String("topic", m.Topic), slog.Int("attempt", m.Attempts)}
	write := func(sql string, args ...any) bool {
		tag, werr := r.db.Exec(writeCtx, sql, append([]any{m.ID, b.token}, args...)...)
		switch {
		case werr != nil:
			r.logger.WarnContext(ctx, "could not record a delivery's outcome; the message will be taken again",
				append(attrs, slog.Any("error", werr))...)
		case tag.RowsAffected() == 0:
			r.logger.WarnContext(ctx, "the batch's lease ran out before the outcome was recorded; the message will be taken again",
				attrs...)
		default:
			return true
		}
		return false
	}
	switch {
	case err == nil:
		if write(r.sql.delivered) {
			stats.Delivered++
			r.observe(Observer.Delivered, m.Topic)
		}
	case m.Attempts >= r.cfg.MaxAttempts:
		if write(r.sql.dead, err.Error()) {
			stats.Dead++
			r.observe(Observer.Dead, m.Topic)
			r.logger.ErrorContext(ctx, "outbox message dead-lettered", append(attrs, slog.Any("error", err))...)
		}
	default:
		wait := r.cfg.Backoff(m.Attempts)
		if write(r.sql.retryLater, wait.Microseconds(), err.Error()) {
			stats.Retried++
			r.observe(Observer.Retried, m.Topic)
			r.logger.WarnContext(ctx, "outbox delivery failed; will retry",
				append(attrs, slog.Duration("after", wait), slog.Any("error", err))...)
		}
	}
}

// call runs the handler with a timeout, turning a panic into an error.
func (r *Relay) call(ctx context.Context, m *Record, timeout time.Duration) (err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("handler panicked: %v", v)
			r.logger.ErrorContext(ctx, "outbox handler panicked", slog.Int64("id", m.ID), slog.String("topic", m.Topic),
				slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
		}
	}()
	handler := r.cfg.Handlers[m.Topic]
	if handler == nil {
		return errors.New("no handler for topic " + m.Topic)
	}
	return handler(ctx, m)
}

// giveBack makes taken messages available again at once, for a relay that
// stops mid-batch or runs short of lease.
func (r *Relay) giveBack(b *batch, messages []Record) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range messages {
		_, _ = r.db.Exec(ctx, r.sql.giveBack, m.ID, b.token)
	}
}

func (r *Relay) observe(event func(Observer, string), topic string) {
	if r.cfg.Observer != nil {
		event(r.cfg.Observer, topic)
	}
}
