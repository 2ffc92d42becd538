package recovery

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/opentx"
)

// batchConn is one connection that takes statements one at a time or in a
// batch, sent in one round trip: *pgxpool.Conn and *pgx.Conn satisfy it.
// It is an alias of an unnamed type so that package seam can name the same
// type.
type batchConn = interface {
	DBTX
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// leaseLostCode is the SQLSTATE onceflow_lease_lost() raises.
const leaseLostCode = "OF001"

// txEndedCode is the SQLSTATE onceflow_same_transaction() raises.
const txEndedCode = "OF002"

// beginAndClaim sends begin (statements ending with a BEGIN), the
// statement that marks the transaction with mark (opentx.SetMarkSQL; none
// when mark is "") and the claim of p in one round trip on conn, so the
// claim opens the caller's transaction. Whatever
// it returns, the transaction is open on conn: the caller commits it or
// rolls it back. Use it on a connection taken from a pool, not in a pgx.Tx.
//
// A new record is not inserted yet (migration 0019): the transaction's
// first fenced write (advanceAndCommit, completeAndCommit, Advance,
// Complete, Fail) inserts it with its outcome, and a transaction that
// commits without one leaves no record, as one that rolls back. Until
// then, the key lock the claim took keeps every other claim of the key out.
func (s *Store) beginAndClaim(ctx context.Context, conn batchConn, begin []string, mark string, p ClaimParams) (*Record, Outcome, error) {
	args, err := s.claimArgs(p)
	if err != nil {
		return nil, 0, err
	}
	b := &pgx.Batch{}
	for _, stmt := range begin {
		b.Queue(stmt)
	}
	if mark != "" {
		b.Queue(opentx.SetMarkSQL, mark)
	}
	b.Queue(s.sql.claimDeferred, args...)
	br := conn.SendBatch(ctx, b)
	for range len(b.QueuedQueries) - 1 {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, 0, s.dbError("begin", err) // the claim is prepared with it
		}
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, 0, s.claimError(p.Key, err)
	}
	inTx := s.withConn(conn)
	inTx.inTx = true // the claim runs in the transaction begin opened
	rec, outcome, err := inTx.claimFrom(ctx, p, args, collectedRow{rows: rows, close: br.Close}, true)
	if closeErr := br.Close(); err == nil && closeErr != nil {
		return nil, 0, fmt.Errorf("claim key: %w", closeErr)
	}
	return rec, outcome, err
}

// withConn returns a Store whose statements run on conn, inside whatever
// transaction is open there.
func (s *Store) withConn(conn DBTX) *Store {
	c := *s
	c.db, c.inTx = conn, isTx(conn)
	return &c
}

// collectedRow reads the claim's row from a batch, then finishes the batch,
// so that a re-run of the claim can use the connection.
type collectedRow struct {
	rows  pgx.Rows
	close func() error
}

func (r collectedRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		r.rows.Close()
		if err := r.close(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.close()
}

// advanceAndCommit commits the transaction open on conn together with the
// recovery point, in one round trip (see Advance). If the fence does not
// hold, the statement fails, the COMMIT does not run, and it returns
// ErrLeaseLost with the transaction still open and aborted: roll it back.
// With a mark (opentx.Tx.Mark), the transaction must still carry it, or
// nothing runs and it returns opentx.ErrEnded, the transaction aborted.
func (s *Store) advanceAndCommit(ctx context.Context, conn batchConn, mark string, f Fence, recoveryPoint string, state []byte) error {
	if err := checkName("recovery point", recoveryPoint); err != nil {
		return err
	}
	if f.pending() {
		return s.insertAndCommit(ctx, conn, mark, "advance", f, advancing(recoveryPoint, state))
	}
	return s.andCommit(ctx, conn, mark, "advance", f, s.sql.advanceOrFail,
		f.Key.Tenant, f.Key.ID, f.Owner, recoveryPoint, state, s.lease)
}

// completeAndCommit commits the transaction open on conn together with the
// completion, in one round trip (see completeAfter; an empty recoveryPoint
// and a nil state keep what the record holds, as Complete does). On
// ErrLeaseLost or opentx.ErrEnded (see advanceAndCommit) the transaction is
// still open and aborted: roll it back.
func (s *Store) completeAndCommit(ctx context.Context, conn batchConn, mark string, f Fence, recoveryPoint string, state []byte, resp Response) error {
	var point *string
	if recoveryPoint != "" {
		if err := checkName("recovery point", recoveryPoint); err != nil {
			return err
		}
		point = &recoveryPoint
	}
	in, err := s.finishing(StatusCompleted, TransitionCompleted, resp, nil, point, state)
	if err != nil {
		return err
	}
	if f.pending() {
		return s.insertAndCommit(ctx, conn, mark, "complete", f, in)
	}
	return s.andCommit(ctx, conn, mark, "complete", f, s.sql.finishOrFail, in.finishArgs(f)...)
}

func (s *Store) andCommit(ctx context.Context, conn batchConn, mark, op string, f Fence, sql string, args ...any) error {
	err := s.sendAndCommit(ctx, conn, mark, sql, args)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == leaseLostCode:
		return lostLease(op, f)
	case err != nil:
		return s.commitError(op+" key and commit", err)
	}
	return nil
}

// commitMarked commits the transaction open on conn, which carries mark
// (see advanceAndCommit), in one round trip: the owner's COMMIT of a
// transaction it wrote its record in statement by statement. Without a
// mark it is a plain COMMIT.
func (s *Store) commitMarked(ctx context.Context, conn batchConn, mark string) error {
	b := &pgx.Batch{}
	s.queueMarkCheck(b, mark)
	b.Queue("commit")
	br := conn.SendBatch(ctx, b)
	var err error
	for range b.QueuedQueries {
		if _, err = br.Exec(); err != nil {
			break
		}
	}
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return s.commitError("commit", err)
	}
	return nil
}

// queueMarkCheck queues the check that the transaction still carries
// mark, when there is one.
func (s *Store) queueMarkCheck(b *pgx.Batch, mark string) {
	if mark != "" {
		b.Queue(s.sql.sameTransaction, mark)
	}
}

// commitError is err, from statements sent with a COMMIT, as the caller
// branches on: opentx.ErrEnded for a transaction that lost its mark.
func (s *Store) commitError(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == txEndedCode {
		return fmt.Errorf("%s: %w", op, opentx.ErrEnded)
	}
	return s.dbError(op, err)
}

// insertAndCommit inserts f's unwritten record with the outcome in and
// commits the transaction open on conn, in one round trip, behind the
// check of mark. On an error the transaction is still open and aborted:
// roll it back.
func (s *Store) insertAndCommit(ctx context.Context, conn batchConn, mark, op string, f Fence, in insertion) error {
	err := s.sendAndCommit(ctx, conn, mark, s.sql.insert, s.insertArgs(f, in))
	if err == nil || commitUnknown(err) {
		f.unwritten.inserted.Store(true) // landed or may have: no later write inserts it
	}
	if err != nil {
		return s.insertError(op+" and commit", f, err)
	}
	return nil
}

// commitUnknown reports whether err, from a statement sent with a COMMIT,
// leaves the commit's outcome unknown: the connection was lost or the
// server ended the session (a FATAL error), before or after committing.
// An error the server answered in a session that goes on (severity ERROR)
// means nothing was committed.
func commitUnknown(err error) bool {
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) || pgErr.Severity != "ERROR"
}

// sendAndCommit sends the check of mark (none when mark is ""), sql and a
// COMMIT in one batch.
func (s *Store) sendAndCommit(ctx context.Context, conn batchConn, mark, sql string, args []any) error {
	b := &pgx.Batch{}
	s.queueMarkCheck(b, mark)
	b.Queue(sql, args...)
	b.Queue("commit")
	br := conn.SendBatch(ctx, b)
	var err error
	for range b.QueuedQueries {
		if _, err = br.Exec(); err != nil {
			break
		}
	}
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	return err
}

// orFail turns a fenced UPDATE into a statement that raises OF001 when it
// matches no row.
func orFail(update string) string {
	return `WITH done AS (` + strings.TrimSpace(update) + ` RETURNING 1)
SELECT CASE WHEN EXISTS (SELECT 1 FROM done) THEN 1 ELSE {schema}.onceflow_lease_lost() END`
}
