package recovery

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Outcome says what a successful claim gives its caller.
type Outcome int

const (
	// OutcomeNew: the key was absent; the caller owns a new record and
	// executes from the start.
	OutcomeNew Outcome = iota + 1
	// OutcomeTakeover: the lease had expired; the caller owns the record
	// under a new owner token and resumes after Record.RecoveryPoint.
	OutcomeTakeover
	// OutcomeReplay: the record is finished; answer with Record.Response.
	OutcomeReplay
)

// String returns "new", "takeover" or "replay".
func (o Outcome) String() string {
	switch o {
	case OutcomeNew:
		return "new"
	case OutcomeTakeover:
		return "takeover"
	case OutcomeReplay:
		return "replay"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// ClaimParams describes a request that carries an idempotency key.
type ClaimParams struct {
	Key Key
	// Workflow names the operation: a workflow's name, or an HTTP method and
	// route. Required; the same input rules as a key apply.
	Workflow string
	// Fingerprint identifies the request (FingerprintJSON, FingerprintBytes).
	Fingerprint Fingerprint
	// Request is stored with a new record so the work can resume without
	// the client, byte for byte (a json column: PostgreSQL keeps its
	// spelling, member order and duplicate keys). It must be JSON in UTF-8
	// (an *InputError says when it is not); nil or empty stores nothing.
	Request []byte
	// Lease is how long the claim holds the key. 0 means the Store's lease
	// (Config.Lease).
	Lease time.Duration
	// Principal is who makes the request within the tenant (a user, an API
	// client). Its SHA-256 is stored with a new record, and a claim of the
	// key by any other principal is ErrForbidden. "" means the tenant
	// itself: every caller of the tenant is one principal.
	Principal string
	// Definition is the fingerprint of the workflow definition that claims
	// the key, stored with a new record (see workflow.Definition). ""
	// stores none.
	Definition string
	// TraceParent is the W3C traceparent of the request that creates the
	// record, stored with a new record and never changed (see
	// Record.TraceParent), so that every later attempt can link to that
	// trace. At most 255 bytes of lower-case hex digits and dashes; ""
	// stores none. A claim of an existing record ignores it.
	TraceParent string
}

// principalHash is what the record keeps of a principal.
func principalHash(k Key, principal string) []byte {
	sum := sha256.Sum256([]byte(cmp.Or(principal, k.Tenant)))
	return sum[:]
}

// abandonedError is recorded when a takeover finds a lease that ran out
// without being released: its holder stopped or lost touch.
const abandonedError = "lease expired: the previous attempt stopped without finishing or releasing the key"

// claimRetries bounds how often Claim re-runs its statement after the row it
// read was deleted before it could write (a pruner, or a rejected first
// claim deleting itself).
const claimRetries = 3

// Claim applies the state machine to a request carrying p.Key, in one
// statement:
//
//   - absent: creates the record and returns OutcomeNew;
//   - in flight with an expired lease and the same fingerprint: takes it
//     over with a new owner token and returns OutcomeTakeover;
//   - completed or failed with the same fingerprint: returns OutcomeReplay;
//   - in flight with a valid lease: returns an *InFlightError (ErrInFlight);
//   - any existing record made by another principal (p.Principal):
//     ErrForbidden, whatever its state or request, so that the answer
//     says nothing of the record;
//   - any existing record with a different fingerprint or workflow:
//     ErrMismatch.
//
// Invalid input returns an *InputError and writes nothing.
//
// Run Claim on a pool or in a READ COMMITTED transaction: after losing a
// race to a concurrent claim it reads the row again, which needs a fresh
// snapshot per statement.
func (s *Store) Claim(ctx context.Context, p ClaimParams) (*Record, Outcome, error) {
	args, err := s.claimArgs(p)
	if err != nil {
		return nil, 0, err
	}
	return s.claimFrom(ctx, p, args, nil, false)
}

// claimArgs checks p and returns the claim statement's arguments.
func (s *Store) claimArgs(p ClaimParams) ([]any, error) {
	if err := p.Key.Validate(); err != nil {
		return nil, err
	}
	if err := checkName("workflow", p.Workflow); err != nil {
		return nil, err
	}
	request, err := checkRequest(p.Request)
	if err != nil {
		return nil, err
	}
	lease, err := leaseMicros(p.Lease, s.Lease())
	if err != nil {
		return nil, err
	}
	var definition *string
	if p.Definition != "" {
		if err := checkName("definition", p.Definition); err != nil {
			return nil, err
		}
		definition = &p.Definition
	}
	trace, err := checkTraceParent(p.TraceParent)
	if err != nil {
		return nil, err
	}
	return []any{p.Key.Tenant, p.Key.ID, uuid.New(), p.Workflow, p.Fingerprint[:], request, uuid.New(),
		lease, abandonedError, principalHash(p.Key, p.Principal), definition, trace}, nil
}

// maxTraceParent bounds a stored traceparent (the column's check, migration
// 0014); version 00 of the W3C format is 55 bytes.
const maxTraceParent = 255

// checkTraceParent returns the traceparent to store: nil for none, else
// what the W3C format is made of (lower-case hex digits and dashes), at
// most maxTraceParent bytes. Its fields are the tracer's to parse.
func checkTraceParent(tp string) (*string, error) {
	if tp == "" {
		return nil, nil
	}
	if len(tp) > maxTraceParent {
		return nil, &InputError{Field: "trace parent", Problem: fmt.Sprintf("is %d bytes, longer than %d", len(tp), maxTraceParent)}
	}
	for i := range len(tp) {
		if c := tp[i]; c != '-' && (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return nil, &InputError{Field: "trace parent", Problem: "holds a byte other than a lower-case hex digit or a dash"}
		}
	}
	return &tp, nil
}

// checkRequest returns the request to store: nil for none, else JSON in
// valid UTF-8, which is what the json column accepts.
func checkRequest(request []byte) ([]byte, error) {
	if len(request) == 0 {
		return nil, nil
	}
	if !utf8.Valid(request) || !json.Valid(request) {
		return nil, &InputError{Field: "request", Problem: "is not JSON in valid UTF-8"}
	}
	return request, nil
}

// claimFrom decides the claim from row, the claim statement's result when
// the caller already sent it, or runs the statement itself. It runs the
// statement again when the row it read was deleted before its write, and,
// outside a transaction, once after finding the key locked: a claim refused
// the key lock by a concurrent claim's statement (migration 0017) finds
// that claim's row committed on the re-run and answers from its lease, and
// one that waited out the claim's lock_timeout on a busy server tries once
// more.
//
// When deferred, the statement is claimDeferredSQL, and a new record it
// returns is left for the transaction's first fenced write to insert.
func (s *Store) claimFrom(ctx context.Context, p ClaimParams, args []any, row pgx.Row, deferred bool) (*Record, Outcome, error) {
	lockRetry := !s.inTx
	sql := s.sql.claim
	if deferred {
		sql = s.sql.claimDeferred
	}
	for range claimRetries {
		if row == nil {
			row = s.db.QueryRow(ctx, sql, args...)
		}
		var (
			outcome int
			dbNow   time.Time
			history []byte
		)
		extra := []any{&outcome, &dbNow}
		if deferred {
			extra = append(extra, &history)
		}
		extra = append(extra, nil) // the idle bound it set
		rec, err := scanRecord(row, extra...)
		row = nil
		if errors.Is(err, pgx.ErrNoRows) {
			continue // the row read was deleted before the write
		}
		if err != nil {
			if lockRetry && isLockTimeout(err) {
				lockRetry = false
				continue
			}
			return nil, 0, s.claimError(p.Key, err)
		}
		rec.readAt(dbNow)
		switch {
		case outcome == claimedNew:
			if deferred {
				rec.unwritten = newUnwritten(args, rec, history)
			}
			return rec, OutcomeNew, nil
		case outcome == claimedTakeover:
			return rec, OutcomeTakeover, nil
		case outcome == claimedByOther:
			return nil, 0, fmt.Errorf("%w (tenant %q, key %q)", ErrForbidden, p.Key.Tenant, p.Key.ID)
		case rec.Fingerprint != p.Fingerprint || rec.Workflow != p.Workflow:
			return nil, 0, fmt.Errorf("%w (tenant %q, key %q)", ErrMismatch, p.Key.Tenant, p.Key.ID)
		case rec.Finished():
			return rec, OutcomeReplay, nil
		case rec.Status == StatusParked:
			return nil, 0, &ParkedError{Key: p.Key, Reason: rec.LastError}
		default:
			return nil, 0, inFlight(p.Key, rec, dbNow)
		}
	}
	return nil, 0, &InFlightError{Key: p.Key, RetryAfter: time.Second}
}

// takeover takes over k's record of the named workflow when its lease has
// expired, whatever request it holds: for resuming work from the stored
// request when the client is gone (a sweeper, Engine.Resume). It returns
// OutcomeTakeover with a new owner token, OutcomeReplay when the record is
// finished, an *InFlightError while a valid lease holds it, ErrMismatch
// when the record belongs to another workflow (the key was reused after
// its record was pruned, say), and ErrNotFound when there is no record. It
// never creates one.
func (s *Store) takeover(ctx context.Context, k Key, workflow string) (*Record, Outcome, error) {
	if err := k.Validate(); err != nil {
		return nil, 0, err
	}
	var (
		outcome int
		dbNow   time.Time
	)
	rec, err := scanRecord(s.db.QueryRow(ctx, s.sql.takeover, k.Tenant, k.ID, uuid.New(), s.lease, abandonedError, workflow),
		&outcome, &dbNow, nil) // nil: the idle bound it set
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, 0, fmt.Errorf("take over key: %w (tenant %q, key %q)", ErrNotFound, k.Tenant, k.ID)
	case isLockTimeout(err):
		return nil, 0, &InFlightError{Key: k, RetryAfter: time.Second}
	case err != nil:
		return nil, 0, s.dbError("take over key", err)
	}
	rec.readAt(dbNow)
	switch {
	case rec.Workflow != workflow:
		return nil, 0, fmt.Errorf("take over key: %w: the record belongs to workflow %q, not %q (tenant %q, key %q)",
			ErrMismatch, rec.Workflow, workflow, k.Tenant, k.ID)
	case outcome == claimedTakeover:
		return rec, OutcomeTakeover, nil
	case rec.Finished():
		return rec, OutcomeReplay, nil
	case rec.Status == StatusParked:
		return nil, 0, &ParkedError{Key: k, Reason: rec.LastError}
	default:
		return nil, 0, inFlight(k, rec, dbNow)
	}
}

// ExpireLease ends k's lease now, as if its holder had stopped renewing it,
// so that the next claim takes the record over. It is for tests (crash
// simulations that must not wait out a lease) and for operators who know a
// holder is gone. The holder is not told; its next fenced write after a
// takeover fails with ErrLeaseLost. It returns ErrNotFound when k has no
// record in flight.
func (s *Store) ExpireLease(ctx context.Context, k Key) error {
	if err := k.Validate(); err != nil {
		return err
	}
	tag, err := s.db.Exec(ctx, s.sql.expire, k.Tenant, k.ID)
	if err != nil {
		return s.dbError("expire lease", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("expire lease: %w in flight (tenant %q, key %q)", ErrNotFound, k.Tenant, k.ID)
	}
	return nil
}

// lockNotAvailable is the SQLSTATE the claim and the takeover fail with
// when another transaction holds the key's lock, which they take without
// waiting (migration 0017), and when a lock wait of theirs ran past
// lock_timeout (1 s in the claim).
const lockNotAvailable = "55P03"

// claimError is what a claim statement's error means to the caller. A
// locked key means a concurrent claim or takeover of it is uncommitted (its
// first phase may run in the same transaction): the key is in flight,
// answered at once instead of after that phase.
func (s *Store) claimError(k Key, err error) error {
	if isLockTimeout(err) {
		return &InFlightError{Key: k, RetryAfter: time.Second, Contended: true}
	}
	return s.dbError("claim key", err)
}

func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable
}

// inFlight is the ErrInFlight of a claim or takeover that found rec held,
// or deferred, at dbNow by the database clock.
func inFlight(k Key, rec *Record, dbNow time.Time) *InFlightError {
	return &InFlightError{Key: k, RetryAfter: retryAfter(rec, dbNow), Deferred: rec.NotBefore.After(dbNow)}
}

// retryAfter is how long until rec may be taken over by the database
// clock: until its lease ends, or, for a deferred record (whose released
// lease ended at -infinity), until its NotBefore. At least a second: a
// claim that read an expired lease lost the takeover to a concurrent one,
// which now holds a fresh lease.
func retryAfter(rec *Record, dbNow time.Time) time.Duration {
	return max(rec.LockedUntil.Sub(dbNow), rec.NotBefore.Sub(dbNow), time.Second)
}

// leaseMicros returns a lease in microseconds, def for 0.
func leaseMicros(lease, def time.Duration) (int64, error) {
	if lease == 0 {
		lease = def
	}
	if lease < time.Millisecond {
		return 0, &InputError{Field: "lease", Problem: fmt.Sprintf("is %s, shorter than 1ms", lease)}
	}
	return lease.Microseconds(), nil
}
