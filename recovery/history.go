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
	// Resume or the completer); Error is set when the lease it took had
	// run out without being released.
	TransitionTakenOver TransitionKind = "taken_over"
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
