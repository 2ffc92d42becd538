package recovery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Load returns the record for k, or ErrNotFound.
func (s *Store) Load(ctx context.Context, k Key) (*Record, error) {
	if err := k.Validate(); err != nil {
		return nil, err
	}
	var dbNow time.Time
	rec, err := scanRecord(s.db.QueryRow(ctx, s.sql.load, k.Tenant, k.ID), &dbNow)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w (tenant %q, key %q)", ErrNotFound, k.Tenant, k.ID)
	}
	if err != nil {
		return nil, s.dbError("load key", err)
	}
	rec.readAt(dbNow)
	return rec, nil
}

// Advance commits a recovery point: the name of the step whose result is now
// committed, and the workflow state (JSON) after it. Run it in the step's
// own transaction (WithTx) so the step's writes and the recovery point
// commit together. It also extends the lease by the Store's lease: progress
// shows the holder is alive.
func (s *Store) Advance(ctx context.Context, f Fence, recoveryPoint string, state []byte) error {
	if err := checkName("recovery point", recoveryPoint); err != nil {
		return err
	}
	if f.pending() {
		return s.insert(ctx, "advance", f, advancing(recoveryPoint, state))
	}
	tag, err := s.db.Exec(ctx, s.sql.advance, f.Key.Tenant, f.Key.ID, f.Owner, recoveryPoint, state, s.lease)
	return s.fenced("advance", f, tag, err)
}

// Complete marks the record completed and stores resp for replay: the
// status, the allow-listed headers, and the body byte for byte.
func (s *Store) Complete(ctx context.Context, f Fence, resp Response) error {
	return s.finish(ctx, "complete", f, StatusCompleted, resp, nil, nil, nil)
}

// completeAfter completes the record like Complete and, in the same
// statement, records the step that produced the response and the final
// state (JSON), as Advance would.
func (s *Store) completeAfter(ctx context.Context, f Fence, recoveryPoint string, state []byte, resp Response) error {
	if err := checkName("recovery point", recoveryPoint); err != nil {
		return err
	}
	return s.finish(ctx, "complete", f, StatusCompleted, resp, nil, &recoveryPoint, state)
}

// Fail marks the record failed terminally, stores resp (typically a 500) for
// replay, and keeps cause as the last error. Retries get resp; nothing runs
// again.
func (s *Store) Fail(ctx context.Context, f Fence, resp Response, cause string) error {
	return s.fail(ctx, s.sql.finish, TransitionFailed, f, resp, cause)
}

// failLeaseOver fails the record like Fail, only if its lease is over by
// the database clock, checked in the statement that writes: a holder that
// renewed the lease keeps it, and the call returns ErrLeaseLost. It is the
// operator's fail (onceflow keys fail without --force).
func (s *Store) failLeaseOver(ctx context.Context, f Fence, resp Response, cause string) error {
	return s.fail(ctx, s.sql.finishLeaseOver, TransitionFailedByOperator, f, resp, cause)
}

// forceFail fails the record like Fail, whatever its lease: the operator's
// fail with --force. Its history names the operator.
func (s *Store) forceFail(ctx context.Context, f Fence, resp Response, cause string) error {
	return s.fail(ctx, s.sql.finish, TransitionFailedByOperator, f, resp, cause)
}

func (s *Store) fail(ctx context.Context, sql string, kind TransitionKind, f Fence, resp Response, cause string) error {
	c := cleanError(cause)
	return s.finishWith(ctx, sql, "fail", kind, f, StatusFailed, resp, &c, nil, nil)
}

func (s *Store) finish(ctx context.Context, op string, f Fence, status Status, resp Response,
	cause, recoveryPoint *string, state []byte) error {
	return s.finishWith(ctx, s.sql.finish, op, TransitionKind(status), f, status, resp, cause, recoveryPoint, state)
}

// finishWith runs sql, finishSQL or a statement with its parameters, kind
// the transition its history records.
func (s *Store) finishWith(ctx context.Context, sql, op string, kind TransitionKind, f Fence, status Status, resp Response,
	cause, recoveryPoint *string, state []byte) error {
	in, err := s.finishing(status, kind, resp, cause, recoveryPoint, state)
	if err != nil {
		return fmt.Errorf("%s key: %w", op, err)
	}
	if f.pending() {
		return s.insert(ctx, op, f, in)
	}
	tag, err := s.db.Exec(ctx, sql, in.finishArgs(f)...)
	return s.fenced(op, f, tag, err)
}

// finishing returns the outcome a record finishes with: its status, the
// transition its history records, the response as stored, the last error,
// and the recovery point and state (nil keeps the old value of each).
func (s *Store) finishing(status Status, kind TransitionKind, resp Response, cause, recoveryPoint *string, state []byte) (insertion, error) {
	if resp.Status < 100 || resp.Status > 999 {
		return insertion{}, &InputError{Field: "response status", Problem: fmt.Sprintf("is %d, not a three-digit HTTP status", resp.Status)}
	}
	stored := s.stored(resp)
	header, err := encodeHeader(stored.Header)
	if err != nil {
		return insertion{}, fmt.Errorf("encode header: %w", err)
	}
	return insertion{status: status, kind: kind, recoveryPoint: recoveryPoint, state: state,
		respStatus: &stored.Status, body: stored.Body, header: header, cause: cause}, nil
}

// finishArgs returns finishSQL's arguments for f's record finishing with in.
func (in insertion) finishArgs(f Fence) []any {
	return []any{f.Key.Tenant, f.Key.ID, f.Owner, string(in.status), *in.respStatus, in.body, in.header, in.cause,
		in.recoveryPoint, in.state, string(in.kind)}
}

// Release hands the lease back after an attempt failed in a way a retry may
// fix: the record stays in flight at its recovery point, attempts grows by
// one, cause is kept as the last error, and the next claim takes it over at
// once. The released owner token is retired, so the attempt can write no
// more.
func (s *Store) Release(ctx context.Context, f Fence, cause string) error {
	return s.release(ctx, s.sql.release, TransitionReleased, f, cause)
}

// releaseLeaseOver releases the record like Release, only if its lease is
// over by the database clock, checked in the statement that writes: a
// holder that renewed the lease keeps it, and the call returns
// ErrLeaseLost. It is the operator's release (onceflow keys release
// without --force).
func (s *Store) releaseLeaseOver(ctx context.Context, f Fence, cause string) error {
	return s.release(ctx, s.sql.releaseLeaseOver, TransitionReleasedByOperator, f, cause)
}

// forceRelease releases the record like Release, whatever its lease: the
// operator's release with --force. Its history names the operator.
func (s *Store) forceRelease(ctx context.Context, f Fence, cause string) error {
	return s.release(ctx, s.sql.release, TransitionReleasedByOperator, f, cause)
}

// release runs sql, releaseSQL or a statement with its parameters, kind
// the transition its history records.
func (s *Store) release(ctx context.Context, sql string, kind TransitionKind, f Fence, cause string) error {
	tag, err := s.db.Exec(ctx, sql, f.Key.Tenant, f.Key.ID, f.Owner, cleanError(cause), string(kind))
	return s.fenced("release", f, tag, err)
}

// handBack hands the lease back like Release but without counting an
// attempt: for an attempt that stopped because its caller went away, not
// because its work failed. cause is kept as the last error.
func (s *Store) handBack(ctx context.Context, f Fence, cause string) error {
	tag, err := s.db.Exec(ctx, s.sql.handBack, f.Key.Tenant, f.Key.ID, f.Owner, cleanError(cause))
	return s.fenced("hand back", f, tag, err)
}

// handBackFor releases the lease like Release, counting an attempt when
// counted is set (so that MaxAttempts bounds a downstream that defers for
// ever; a deferral that only waits its turn, having called nothing, is
// not a failure), and defers the record: no claim, Resume or completer
// takes it over until after (at most MaxDefer) has passed by the database
// clock. A claim meanwhile gets an *InFlightError with the time left. It
// returns that time (Record.NotBefore).
func (s *Store) handBackFor(ctx context.Context, f Fence, after time.Duration, cause string, counted bool) (time.Time, error) {
	after = min(max(after, 0), MaxDefer)
	attempts := 0
	if counted {
		attempts = 1
	}
	var notBefore time.Time
	err := s.db.QueryRow(ctx, s.sql.handBackFor, f.Key.Tenant, f.Key.ID, f.Owner, cleanError(cause), after.Microseconds(), attempts).
		Scan(&notBefore)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, lostLease("defer", f)
	}
	if err != nil {
		return time.Time{}, s.dbError("defer key", err)
	}
	return notBefore, nil
}

// stored returns resp as Complete and Fail store it, and as every replay
// returns it: allow-listed headers only, a nil body as an empty one.
func (s *Store) stored(resp Response) Response {
	stored := Response{Status: resp.Status, Header: s.keepHeaders(resp.Header), Body: resp.Body}
	if stored.Body == nil {
		stored.Body = []byte{}
	}
	return stored
}

// Renew extends the lease to lease from now by the database clock and
// returns its new end. 0 means the Store's lease.
func (s *Store) Renew(ctx context.Context, f Fence, lease time.Duration) (time.Time, error) {
	micros, err := leaseMicros(lease, s.Lease())
	if err != nil {
		return time.Time{}, err
	}
	var until time.Time
	err = s.db.QueryRow(ctx, s.sql.renew, f.Key.Tenant, f.Key.ID, f.Owner, micros).Scan(&until)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, lostLease("renew", f)
	}
	if err != nil {
		return time.Time{}, s.dbError("renew lease", err)
	}
	return until, nil
}

// DeleteUnstarted removes a record that has committed no recovery point, for
// a request rejected before it changed anything (a validation error): the
// client may retry at once with the same key. It returns ErrStarted when
// the record has a recovery point, and ErrLeaseLost when f no longer owns
// the key.
func (s *Store) DeleteUnstarted(ctx context.Context, f Fence) error {
	tag, err := s.db.Exec(ctx, s.sql.deleteUnstarted, f.Key.Tenant, f.Key.ID, f.Owner)
	if err != nil {
		return s.dbError("delete unstarted key", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	rec, err := s.Load(ctx, f.Key)
	switch {
	case errors.Is(err, ErrNotFound):
		return lostLease("delete unstarted", f)
	case err != nil:
		return fmt.Errorf("delete unstarted key: %w", err)
	case rec.Owner == f.Owner && !rec.Finished() && rec.RecoveryPoint != "":
		return fmt.Errorf("delete unstarted key: %w (recovery point %q)", ErrStarted, rec.RecoveryPoint)
	}
	return lostLease("delete unstarted", f)
}

// fenced turns a fenced write's result into ErrLeaseLost when it matched no
// row.
func (s *Store) fenced(op string, f Fence, tag pgconn.CommandTag, err error) error {
	if err != nil {
		return s.dbError(op+" key", err)
	}
	if tag.RowsAffected() != 1 {
		return lostLease(op, f)
	}
	return nil
}

func lostLease(op string, f Fence) error {
	return fmt.Errorf("%s key: %w (tenant %q, key %q, owner %s)", op, ErrLeaseLost, f.Key.Tenant, f.Key.ID, f.Owner)
}

// cleanError makes an error message storable: valid UTF-8, no NUL bytes
// (PostgreSQL text cannot hold them), at most MaxErrorLength bytes.
func cleanError(msg string) string {
	msg = strings.ToValidUTF8(msg, "\uFFFD")
	msg = strings.ReplaceAll(msg, "\x00", "\uFFFD")
	if len(msg) <= MaxErrorLength {
		return msg
	}
	cut := MaxErrorLength
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut]
}
