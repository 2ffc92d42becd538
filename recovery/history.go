package recovery

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// MaxHistory is how many transitions a record keeps (migration 0014): the
// latest, older ones dropped from the front (Record.HistoryTruncated counts
// them).
const MaxHistory = 50

// MaxHistoryError is how many characters of an error a transition keeps.
const MaxHistoryError = 200

// TransitionKind names what happened to a record.
type TransitionKind string

// The transitions a record's history holds, each appended by the statement
// that makes it.
const (
	// TransitionClaimed: a claim created the record.
	TransitionClaimed TransitionKind = "claimed"
	// TransitionTakenOver: an attempt took the record over (a claim,
	// Resume or the completer) after Step; Error is set when the lease it
	// took had run out without being released.
	TransitionTakenOver TransitionKind = "taken_over"
	// TransitionPhaseCommitted: a phase committed; Step is the new
	// recovery point.
	TransitionPhaseCommitted TransitionKind = "phase_committed"
	// TransitionReleased: an attempt failed in a way a retry may fix and
	// released its lease, counting an attempt (Error says why).
	TransitionReleased TransitionKind = "released"
	// TransitionHandedBack: an attempt stopped because its caller went
	// away and handed its lease back, counting no attempt.
	TransitionHandedBack TransitionKind = "handed_back"
	// TransitionDeferred: a step was told to come back later; the record
	// waits until its NotBefore.
	TransitionDeferred TransitionKind = "deferred"
	// TransitionRenewedLate: the holder renewed its lease after it had
	// ended by the database clock, before anything took the record over:
	// for that while, a claim could have taken the key from a holder still
	// at work. Error says by how much it was late.
	TransitionRenewedLate TransitionKind = "renewed_late"
	// TransitionLeaseExpired: Store.ExpireLease ended the lease.
	TransitionLeaseExpired TransitionKind = "lease_expired"
	// TransitionParked: the running definition may not resume the record
	// (Error says why).
	TransitionParked TransitionKind = "parked"
	// TransitionRestamped: an attempt runs the record under another
	// definition (Definition), from recovery point Step.
	TransitionRestamped TransitionKind = "restamped"
	// TransitionCompensating: the work failed before its point of no
	// return (Error); the compensations start.
	TransitionCompensating TransitionKind = "compensating"
	// TransitionUndone: the compensation of Step committed.
	TransitionUndone TransitionKind = "undone"
	// TransitionCompleted, TransitionFailed, TransitionCompensated: the
	// record finished.
	TransitionCompleted   TransitionKind = "completed"
	TransitionFailed      TransitionKind = "failed"
	TransitionCompensated TransitionKind = "compensated"
	// TransitionReleasedByOperator, TransitionFailedByOperator: an
	// operator released or failed the record (onceflow keys release, keys
	// fail).
	TransitionReleasedByOperator TransitionKind = "released_by_operator"
	TransitionFailedByOperator   TransitionKind = "failed_by_operator"
	// TransitionResumedAs: an operator chose the definition (Definition)
	// a parked record resumes under (Store.Unpark).
	TransitionResumedAs TransitionKind = "resumed_as"
)

// Transition is one entry of a record's history.
type Transition struct {
	// At is when it happened, by the database clock.
	At   time.Time      `json:"at"`
	Kind TransitionKind `json:"kind"`
	// Owner is the owner token of the attempt that made the transition:
	// the new one for a claim or a takeover.
	Owner uuid.UUID `json:"owner"`
	// Step is the step it concerns, where there is one: the recovery point
	// a phase committed, the step a takeover resumed after, the step whose
	// compensation ran.
	Step string `json:"step,omitempty"`
	// Error is the cause, cut to MaxHistoryError characters.
	Error string `json:"error,omitempty"`
	// Definition is the definition fingerprint a transition chose.
	Definition string `json:"definition,omitempty"`
}

// storedHistory is the history column's JSON.
type storedHistory struct {
	Truncated int          `json:"truncated"`
	Entries   []Transition `json:"entries"`
}

// decodeHistory reads the history column into r; nil is no history.
func decodeHistory(r *Record, raw []byte) error {
	if raw == nil {
		return nil
	}
	var h storedHistory
	if err := json.Unmarshal(raw, &h); err != nil {
		return fmt.Errorf("decode stored history: %w", err)
	}
	r.History, r.HistoryTruncated = h.Entries, h.Truncated
	return nil
}
