package recovery

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Status is where a record is in its life.
type Status string

const (
	// StatusInFlight: an attempt holds (or held, if the lease expired) the key.
	StatusInFlight Status = "in_flight"
	// StatusCompleted: the work finished; its response is stored.
	StatusCompleted Status = "completed"
	// StatusFailed: the work failed terminally; its error response is stored.
	StatusFailed Status = "failed"
	// StatusParked: the record was written by a workflow definition that the
	// running one cannot safely resume (a step changed before its recovery
	// point). Nothing runs it until an operator releases, resumes or fails
	// it; LastError says why it was parked.
	StatusParked Status = "parked"
	// StatusCompensated: the work failed terminally before its point of no
	// return, and the compensations of its started foreign steps all ran
	// (migration 0012); the failure response is stored.
	StatusCompensated Status = "compensated"
)

// Record is one idempotency key's row.
type Record struct {
	Key Key
	// ID is minted when the record is created and never changes; derived
	// downstream keys are built from it, so a key reused after its record
	// was pruned derives different downstream keys.
	ID uuid.UUID
	// Workflow is the operation name the key was claimed for.
	Workflow string
	// Definition is the fingerprint of the workflow definition that last
	// ran the record; "" for a record that is not a workflow's, or was made
	// before migration 0010.
	Definition string
	// ResumeAs is the fingerprint of the definition an operator chose to
	// resume a parked record under (Store.Unpark); the next attempt runs
	// the record under it and clears it.
	ResumeAs    string
	Fingerprint Fingerprint
	// Request is the stored request (JSON), so the work can resume without
	// the client. nil when none was stored.
	Request json.RawMessage
	// Owner is the current owner token, the fence for every write.
	Owner  uuid.UUID
	Status Status
	// RecoveryPoint names the last step whose result is committed; "" when
	// none is.
	RecoveryPoint string
	// State is the workflow state committed with RecoveryPoint (JSON).
	State json.RawMessage
	// LockedUntil is when the lease ends by the database clock. Zero when the
	// record is finished or its lease was released (see Released).
	LockedUntil time.Time
	// Released reports an in-flight record whose last attempt handed its
	// lease back: any claim may take it over at once, unless NotBefore is
	// still ahead.
	Released bool
	// NotBefore is the time, by the database clock, before which no claim,
	// Resume or completer takes the record over: its last attempt deferred
	// it (a step returned a *phase.DeferError). Zero when the record is not
	// deferred; the takeover that follows clears it (migration 0011).
	NotBefore time.Time
	// Attempts counts attempts that ended without finishing: each Release,
	// and each takeover of a lease that expired because its holder stopped.
	Attempts  int
	LastError string
	// Undo lists the steps whose compensations are still to run, in the
	// order they run: non-empty while a record in flight is compensating
	// (its Response is then the failure it will answer), and what was left
	// when a compensation failed for good. Starting to compensate resets
	// Attempts: the compensations get MaxAttempts attempts of their own.
	Undo []string
	// Response is the stored response; nil while in flight.
	Response  *Response
	CreatedAt time.Time
	// UpdatedAt is the last claim, commit, release or completion: the last
	// progress. Lease renewals do not move it.
	UpdatedAt   time.Time
	CompletedAt time.Time // zero while in flight
	// FinishedFor is how long the record had been finished when it was
	// read, by the database's clock alone: clock_timestamp() at the read
	// less CompletedAt. CompletedAt is a reading of the database's clock,
	// which may be off the process's; a process places the completion on
	// its own clock as a moment taken before the read less FinishedFor
	// (what idemhttp's Idempotency-Key-Expires is counted from, since the
	// pruner forgets a record by the database's clock). Set on a finished
	// record that Claim, a takeover or Load returns; zero otherwise.
	FinishedFor time.Duration
	// TraceParent is the W3C traceparent of the request that created the
	// record (ClaimParams.TraceParent); "" when it had none, or the record
	// was made before migration 0014.
	TraceParent string
	// History lists the record's transitions, oldest first: at most
	// MaxHistory, the latest (migration 0014). Each was written in the
	// transaction that made it. Empty for a record that has made none
	// since the migration. Only Load and List read it: the record a claim
	// or a takeover returns has none.
	History []Transition
	// HistoryTruncated counts the older transitions dropped from History
	// to keep it at MaxHistory.
	HistoryTruncated int

	// unwritten is set on a new record a claim that opened a transaction
	// returned without inserting it (see unwritten).
	unwritten *unwritten
}

// readAt sets FinishedFor from dbNow, the database's clock when r was
// read. A clock that stepped back between the completion and the read
// counts as none.
func (r *Record) readAt(dbNow time.Time) {
	if r.Finished() && !r.CompletedAt.IsZero() {
		r.FinishedFor = max(dbNow.Sub(r.CompletedAt), 0)
	}
}

// Fence returns the record's key and owner token, which every write after
// the claim must present.
func (r *Record) Fence() Fence { return Fence{Key: r.Key, Owner: r.Owner, unwritten: r.unwritten} }

// Finished reports whether the record is completed, failed terminally or
// compensated: its response is stored. A parked record is not finished.
func (r *Record) Finished() bool {
	return r.Status == StatusCompleted || r.Status == StatusFailed || r.Status == StatusCompensated
}

// Compensating reports a record in flight whose compensations are running
// (see Undo).
func (r *Record) Compensating() bool { return r.Status == StatusInFlight && len(r.Undo) > 0 }

// Fence is what a write must present to change a record: the key and the
// owner token its claim returned.
type Fence struct {
	Key   Key
	Owner uuid.UUID
	// unwritten is the record's insert, when its claim left it to the
	// first write of its transaction.
	unwritten *unwritten
}

// Response is what a finished request answered, stored verbatim and replayed
// to every retry.
type Response struct {
	Status int
	// Header holds the allow-listed response headers (Config.ResponseHeaders),
	// each value stored byte for byte, UTF-8 or not.
	Header http.Header
	// Body is stored byte for byte; a JSON body keeps its key order and
	// whitespace.
	Body []byte
}

// recordColumns is the column list every statement returning a record uses,
// in the order scanRecord reads them.
const recordColumns = columnsButHistory + `, history`

// claimColumns is recordColumns for the claim and the takeover, with no
// history: the attempt that claims has no use for it, and reading and
// decoding it would cost every claim what its length costs. A claimed
// record's History is empty; Load reads it.
const claimColumns = columnsButHistory + `, NULL::jsonb AS history`

const columnsButHistory = `tenant_id, key, id, workflow, request_hash, request, owner, status,
	recovery_point, state, locked_until, attempts, last_error,
	response_status, response_body, response_header, created_at, updated_at, completed_at, definition, resume_as, not_before, undo,
	trace_parent`

// scanRecord reads recordColumns, then extra columns into extra.
func scanRecord(row pgx.Row, extra ...any) (*Record, error) {
	var (
		r              Record
		hash           []byte
		status         string
		recoveryPoint  pgtype.Text
		lockedUntil    pgtype.Timestamptz
		lastError      pgtype.Text
		responseStatus pgtype.Int4
		responseBody   []byte
		responseHeader []byte
		completedAt    pgtype.Timestamptz
		definition     pgtype.Text
		resumeAs       pgtype.Text
		notBefore      pgtype.Timestamptz
		traceParent    pgtype.Text
		history        []byte
		// The request and the state are scanned as bytes: into a
		// json.RawMessage, pgx would parse them first, which every claim
		// would pay for.
		request, state []byte
	)
	dest := append([]any{
		&r.Key.Tenant, &r.Key.ID, &r.ID, &r.Workflow, &hash, &request, &r.Owner, &status,
		&recoveryPoint, &state, &lockedUntil, &r.Attempts, &lastError,
		&responseStatus, &responseBody, &responseHeader, &r.CreatedAt, &r.UpdatedAt, &completedAt, &definition, &resumeAs, &notBefore, &r.Undo,
		&traceParent, &history,
	}, extra...)
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	r.Request, r.State = request, state
	copy(r.Fingerprint[:], hash)
	r.Status = Status(status)
	r.RecoveryPoint = recoveryPoint.String
	r.LastError = lastError.String
	r.Definition = definition.String
	r.ResumeAs = resumeAs.String
	r.TraceParent = traceParent.String
	if err := decodeHistory(&r, history); err != nil {
		return nil, err
	}
	r.Released = lockedUntil.Valid && lockedUntil.InfinityModifier == pgtype.NegativeInfinity
	if lockedUntil.Valid && lockedUntil.InfinityModifier == pgtype.Finite {
		r.LockedUntil = lockedUntil.Time
	}
	if completedAt.Valid {
		r.CompletedAt = completedAt.Time
	}
	if notBefore.Valid && notBefore.InfinityModifier == pgtype.Finite {
		r.NotBefore = notBefore.Time
	}
	if responseStatus.Valid {
		resp := &Response{Status: int(responseStatus.Int32), Body: responseBody}
		if resp.Body == nil {
			resp.Body = []byte{}
		}
		if len(responseHeader) > 0 {
			header, err := decodeHeader(responseHeader)
			if err != nil {
				return nil, fmt.Errorf("decode stored response header: %w", err)
			}
			resp.Header = header
		}
		r.Response = resp
	}
	return &r, nil
}
