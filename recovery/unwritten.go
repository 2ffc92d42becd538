package recovery

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
)

// unwritten is a new record that a claim opening a workflow's first
// transaction decided to create but did not insert (migration 0019): the
// uncommitted row would be invisible to everyone else, and the key lock the
// claim holds to the end of that transaction keeps every other claim out,
// so the record is inserted once, by the transaction's first fenced write
// (a recovery point, a completion or a terminal failure), carrying its
// outcome: one version of the row where an insert and an update made two.
type unwritten struct {
	// insertArgs are insertSQL's first parameters, $1 to $12: what the
	// claim would have inserted.
	insertArgs []any
	// inserted is set once a statement inserted the record. A transaction
	// that then rolls back takes the row with it, and the fenced writes
	// that follow find no record: the lease is lost, as it is. It is set
	// too when a commit that carried the insert failed with its outcome
	// unknown (commitUnknown: the connection lost, the session ended by
	// the server): the key lock went with that transaction, and an insert
	// made after it could land over the claim of an attempt that took the
	// key meanwhile. The fenced writes that follow update the record if
	// the commit landed, and find none if not.
	inserted atomic.Bool
}

// pending reports whether f's record is still to be inserted.
func (f Fence) pending() bool { return f.unwritten != nil && !f.unwritten.inserted.Load() }

// newUnwritten keeps what the claim statement's args and the claimed
// record rec say of the record to insert: history is the claim's
// history, with its 'claimed' entry.
func newUnwritten(args []any, rec *Record, history []byte) *unwritten {
	// args are claimArgs': $1 tenant, $2 key, $3 id, $4 workflow, $5
	// fingerprint, $6 request, $7 owner, ..., $10 principal, $11
	// definition, $12 trace.
	return &unwritten{insertArgs: []any{args[0], args[1], args[2], args[3], args[4], args[5], args[6],
		args[9], args[10], args[11], rec.CreatedAt, history}}
}

// insertSQL inserts an unwritten record with its first outcome. $1-$12 are
// unwritten.insertArgs: tenant, key, id, workflow, fingerprint, request,
// owner, principal hash, definition, traceparent, when it was claimed, and
// its history; $13 the status, $14 the recovery point, $15 the state, $16
// the lease in microseconds (in flight only), $17-$19 the response, $20
// the last error, $21 the transition its history records.
const insertSQL = `INSERT INTO {keys} (tenant_id, key, id, workflow, request_hash, request, owner, principal_hash,
    definition, trace_parent, created_at, history, status, recovery_point, state, locked_until,
    response_status, response_body, response_header, last_error, completed_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6::json, $7, $8, $9, $10, $11,
    {schema}.onceflow_history($12::jsonb, $21, $7, $14, $20), $13, $14, $15::json,
    CASE WHEN $13 = 'in_flight' THEN clock_timestamp() + $16::bigint * interval '1 microsecond' END,
    $17, $18, $19::jsonb, $20, CASE WHEN $13 <> 'in_flight' THEN clock_timestamp() END, clock_timestamp())`

// insertion is the outcome an unwritten record is inserted with.
type insertion struct {
	status        Status
	kind          TransitionKind
	recoveryPoint *string
	state         []byte
	// respStatus, body and header are the response as stored (Store.stored,
	// the header encoded); nil for a record in flight.
	respStatus *int
	body       []byte
	header     []byte
	cause      *string
}

// advancing is the outcome of a recovery point: the record stays in flight.
func advancing(recoveryPoint string, state []byte) insertion {
	return insertion{status: StatusInFlight, kind: TransitionPhaseCommitted, recoveryPoint: &recoveryPoint, state: state}
}

// insertArgs returns insertSQL's arguments for f's record with outcome in.
func (s *Store) insertArgs(f Fence, in insertion) []any {
	return append(append([]any(nil), f.unwritten.insertArgs...), string(in.status), in.recoveryPoint, in.state, s.lease,
		in.respStatus, in.body, in.header, in.cause, string(in.kind))
}

// insert inserts f's unwritten record with the outcome in.
func (s *Store) insert(ctx context.Context, op string, f Fence, in insertion) error {
	_, err := s.db.Exec(ctx, s.sql.insert, s.insertArgs(f, in)...)
	if err != nil {
		return s.insertError(op, f, err)
	}
	f.unwritten.inserted.Store(true)
	return nil
}

// insertError is what an insert's error means: a record committed for the
// key meanwhile, which only a build from before migration 0014 can have
// made (it claims without the key lock), took the key; this attempt lost
// it, and its transaction rolls back. A unique violation of another table
// (a deferred constraint of the phase's own, checked at COMMIT) is the
// phase's error, not a lost key.
func (s *Store) insertError(op string, f Fence, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == uniqueViolation && pgErr.TableName == "onceflow_keys" {
		return lostLease(op, f)
	}
	return s.commitError(op+" key", err)
}

// uniqueViolation is the SQLSTATE of an insert refused by the primary key.
const uniqueViolation = "23505"
