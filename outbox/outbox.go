package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/dbschema"
	"github.com/onceflow/onceflow/recovery"
)

// ErrInvalidInput reports a message or consumer name that breaks the input
// rules; nothing is written.
var ErrInvalidInput = recovery.ErrInvalidInput

// ErrNotFound reports an unknown message id.
var ErrNotFound = errors.New("outbox message not found")

// ErrDuplicate reports a message that Enqueue did not write because a
// message of its topic and dedupe key was enqueued before (it may be
// delivered by now). Errors that match it are *DuplicateError values, which
// name the message.
var ErrDuplicate = errors.New("outbox message already enqueued")

// DuplicateError names a message that Enqueue did not write because a
// message of its topic and dedupe key was enqueued before. It matches
// ErrDuplicate.
type DuplicateError struct {
	Topic     string
	DedupeKey string
}

func (e *DuplicateError) Error() string {
	return fmt.Sprintf("%v: topic %q, dedupe key %q", ErrDuplicate, e.Topic, e.DedupeKey)
}

// Is reports whether target is ErrDuplicate.
func (e *DuplicateError) Is(target error) bool { return target == ErrDuplicate }

// DBTX runs statements: a pgx.Tx (to enqueue with a business change), a
// *pgxpool.Pool or a *pgx.Conn. It is recovery.DBTX.
type DBTX = recovery.DBTX

// Config says where the outbox tables are.
type Config struct {
	// Schema holds onceflow's tables; "" means "public".
	Schema string
}

// withDefaults returns cfg with each zero field set to its default.
func (cfg Config) withDefaults() Config {
	cfg.Schema = cmp.Or(cfg.Schema, dbschema.Default)
	return cfg
}

// validate reports a schema name that breaks the naming rules.
func (cfg Config) validate() error {
	_, err := dbschema.Resolve(cfg.Schema)
	return err
}

// Outbox writes and inspects messages.
type Outbox struct {
	sql *queries
}

// New returns an Outbox for the schema in cfg.
func New(cfg Config) (*Outbox, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Outbox{sql: newQueries(cfg.Schema)}, nil
}

// Message is a side effect to deliver at least once.
type Message struct {
	// Topic selects the handler.
	Topic string
	// DedupeKey is stable per effect (for example "receipt:" and the order
	// id): a message of the same topic and key is enqueued once (Enqueue
	// reports a second one with ErrDuplicate), and a consumer drops a
	// redelivery by it.
	DedupeKey string
	// Payload is encoded as JSON; a json.RawMessage is stored as given.
	Payload any
	// Headers are optional metadata for the handler.
	Headers map[string]string
}

// Enqueue writes msgs with tx, normally the transaction of the business
// change they belong to, so that they exist exactly when it does.
//
// A message whose topic and dedupe key were enqueued before is not written
// again: the first one stands, payload and all. Enqueue writes the other
// messages and returns an error for each such message, a *DuplicateError
// that matches ErrDuplicate (errors.Is), joined with errors.Join. The
// statement does not fail, so tx can go on and commit; a caller that
// expects to enqueue the same message again (a step that may run twice)
// ignores ErrDuplicate, and any other caller has found two effects sharing
// one dedupe key. Any other error (a message breaking the input rules,
// ErrInvalidInput; a failed statement) is returned at once, and tx should
// be rolled back.
func (o *Outbox) Enqueue(ctx context.Context, tx DBTX, msgs ...Message) error {
	var dups []error
	for _, m := range msgs {
		if err := recovery.CheckName("topic", m.Topic); err != nil {
			return err
		}
		if err := recovery.CheckName("dedupe key", m.DedupeKey); err != nil {
			return err
		}
		payload, err := encodePayload(m.Payload)
		if err != nil {
			return err
		}
		headers, err := json.Marshal(m.Headers)
		if err != nil {
			return fmt.Errorf("%w: encode headers: %v", ErrInvalidInput, err)
		}
		if m.Headers == nil {
			headers = []byte("{}")
		}
		tag, err := tx.Exec(ctx, o.sql.enqueue, m.Topic, m.DedupeKey, payload, headers)
		if err != nil {
			return fmt.Errorf("enqueue %s message: %w", m.Topic, err)
		}
		if tag.RowsAffected() == 0 {
			dups = append(dups, &DuplicateError{Topic: m.Topic, DedupeKey: m.DedupeKey})
		}
	}
	return errors.Join(dups...)
}

func encodePayload(p any) ([]byte, error) {
	var raw []byte
	switch v := p.(type) {
	case json.RawMessage:
		raw = v
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("%w: encode payload: %v", ErrInvalidInput, err)
		}
		raw = b
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("%w: payload is not JSON", ErrInvalidInput)
	}
	return raw, nil
}

// Process runs fn in tx at most once per consumer and dedupe key: it first
// records the key in tx, and when the key was recorded before (by an earlier
// delivery that committed) it returns false without calling fn. Commit tx
// after fn's writes: the record and the effect commit together. Concurrent
// deliveries of one message wait for each other on the primary key.
//
// Dedupe keys are unique per topic: a consumer of several topics whose keys
// may coincide should name itself per topic ("receipts/email").
//
// sweeper.Pruner deletes these records after PrunerConfig.ProcessedRetention,
// once no message with their dedupe key is pending or dead in the outbox.
func (o *Outbox) Process(ctx context.Context, tx pgx.Tx, consumer, dedupeKey string, fn func() error) (bool, error) {
	if err := recovery.CheckName("consumer", consumer); err != nil {
		return false, err
	}
	if err := recovery.CheckName("dedupe key", dedupeKey); err != nil {
		return false, err
	}
	tag, err := tx.Exec(ctx, o.sql.markProcessed, consumer, dedupeKey)
	if err != nil {
		return false, fmt.Errorf("record processed message: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	return true, fn()
}

// Status is where a message is.
type Status string

const (
	StatusPending   Status = "pending"
	StatusDelivered Status = "delivered"
	StatusDead      Status = "dead"
)

// Record is a message as the outbox holds it, and what a handler gets.
type Record struct {
	ID          int64             `json:"id"`
	Topic       string            `json:"topic"`
	DedupeKey   string            `json:"dedupe_key"`
	Payload     json.RawMessage   `json:"payload"`
	Headers     map[string]string `json:"headers"`
	Status      Status            `json:"status"`
	Attempts    int               `json:"attempts"`
	AvailableAt time.Time         `json:"available_at"`
	LastError   string            `json:"last_error,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	DeliveredAt *time.Time        `json:"delivered_at,omitempty"`
}

// Filter selects messages to list. Zero fields match everything.
type Filter struct {
	Status Status
	Topic  string
	// After continues a listing: only messages with a larger id. 0 starts
	// at the beginning.
	After int64
	// Limit caps the result; 0 means 100.
	Limit int
}

// List returns messages matching f, oldest first.
func (o *Outbox) List(ctx context.Context, db DBTX, f Filter) ([]Record, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	rows, err := db.Query(ctx, o.sql.list, string(f.Status), f.Topic, limit, f.After)
	if err != nil {
		return nil, fmt.Errorf("list outbox: %w", err)
	}
	return pgx.CollectRows(rows, scanRecord)
}

func scanRecord(row pgx.CollectableRow) (Record, error) {
	var (
		s         Record
		status    string
		lastError *string
	)
	err := row.Scan(&s.ID, &s.Topic, &s.DedupeKey, &s.Payload, &s.Headers, &status, &s.Attempts,
		&s.AvailableAt, &lastError, &s.CreatedAt, &s.DeliveredAt)
	s.Status = Status(status)
	if lastError != nil {
		s.LastError = *lastError
	}
	return s, err
}

// Retry makes a dead message, or one waiting out a backoff, deliverable now
// with a fresh count of attempts. A delivered message, or one a relay is
// delivering, is left alone (ErrNotFound).
func (o *Outbox) Retry(ctx context.Context, db DBTX, id int64) error {
	tag, err := db.Exec(ctx, o.sql.retry, id)
	if err != nil {
		return fmt.Errorf("retry message %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("retry message %d: %w (or delivered, or being delivered)", id, ErrNotFound)
	}
	return nil
}
