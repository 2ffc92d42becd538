package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// MaxUndo bounds the steps one record may have to compensate.
const MaxUndo = 1000

// compensate starts compensating the record f holds (migration 0012): undo
// lists the steps whose compensations are to run, in order, resp is the
// response the key answers once they have, state the workflow state they
// see, and cause the failure, kept as the last error. The lease is renewed
// and attempts start again from zero. It returns ErrLeaseLost when f no
// longer holds the key, or the record is compensating already.
func (s *Store) compensate(ctx context.Context, f Fence, undo []string, resp Response, state []byte, cause string) error {
	if len(undo) == 0 || len(undo) > MaxUndo {
		return &InputError{Field: "steps to undo", Problem: fmt.Sprintf("are %d; want 1 to %d", len(undo), MaxUndo)}
	}
	for _, step := range undo {
		if err := checkName("step to undo", step); err != nil {
			return err
		}
	}
	failure, err := s.finishing(StatusInFlight, "", resp, nil, nil, nil)
	if err != nil {
		return fmt.Errorf("compensate key: %w", err)
	}
	var stateArg any // NULL keeps the committed state
	if state != nil {
		stateArg = json.RawMessage(state)
	}
	tag, err := s.db.Exec(ctx, s.sql.compensate, f.Key.Tenant, f.Key.ID, f.Owner, undo,
		*failure.respStatus, failure.body, failure.header, stateArg, cleanError(cause), s.lease)
	return s.fenced("compensate", f, tag, err)
}

// undone commits the compensation of step, the head of the record's list,
// with state, and removes it from the list. It reports whether that
// finished the record (StatusCompensated).
func (s *Store) undone(ctx context.Context, f Fence, step string, state []byte) (bool, error) {
	var finished bool
	err := s.db.QueryRow(ctx, s.sql.undone, f.Key.Tenant, f.Key.ID, f.Owner, step, json.RawMessage(state), s.lease).
		Scan(&finished)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, lostLease("undo", f)
	}
	if err != nil {
		return false, s.dbError("undo", err)
	}
	return finished, nil
}
