package recovery

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"
)

// StoredDefinition is a workflow definition as the database keeps it
// (migration 0010): every definition that claimed a key is stored once, so
// that a process running a changed definition can compare a record's with
// its own, and `onceflow workflows export` can write them out.
type StoredDefinition struct {
	Workflow    string
	Fingerprint string
	// Version is the definition's label: its explicit version, or a short
	// form of its fingerprint.
	Version string
	// Spec is the definition as JSON (package workflow's Spec).
	Spec      json.RawMessage
	CreatedAt time.Time
}

// Definitions returns the stored definitions of workflow ("" for every
// workflow) with fingerprint ("" for any), oldest first.
func (s *Store) Definitions(ctx context.Context, workflow, fingerprint string) ([]StoredDefinition, error) {
	return s.definitions(ctx, workflow, fingerprint, false)
}

// DefinitionsInUse returns the stored definitions of workflow ("" for
// every workflow) that a record in flight or parked was written by, or is
// to be resumed as: the ones a deploy must still be able to resume
// (onceflow workflows export).
func (s *Store) DefinitionsInUse(ctx context.Context, workflow string) ([]StoredDefinition, error) {
	return s.definitions(ctx, workflow, "", true)
}

func (s *Store) definitions(ctx context.Context, workflow, fingerprint string, inUse bool) ([]StoredDefinition, error) {
	rows, err := s.db.Query(ctx, s.sql.definitions, workflow, fingerprint, inUse)
	if err != nil {
		return nil, s.dbError("list definitions", err)
	}
	defs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (StoredDefinition, error) {
		var d StoredDefinition
		err := row.Scan(&d.Workflow, &d.Fingerprint, &d.Version, &d.Spec, &d.CreatedAt)
		return d, err
	})
	if err != nil {
		return nil, s.dbError("list definitions", err)
	}
	return defs, nil
}

// saveDefinition stores d unless a definition with its workflow and
// fingerprint is stored already.
func (s *Store) saveDefinition(ctx context.Context, d StoredDefinition) error {
	for field, v := range map[string]string{"workflow": d.Workflow, "fingerprint": d.Fingerprint, "version": d.Version} {
		if err := checkName(field, v); err != nil {
			return err
		}
	}
	if _, err := s.db.Exec(ctx, s.sql.saveDefinition, d.Workflow, d.Fingerprint, d.Version, []byte(d.Spec)); err != nil {
		return s.dbError("save definition", err)
	}
	return nil
}

// park parks the record f holds: no lease, no owner that can write, and
// reason as the last error. Nothing claims it until an operator acts.
func (s *Store) park(ctx context.Context, f Fence, reason string) error {
	tag, err := s.db.Exec(ctx, s.sql.park, f.Key.Tenant, f.Key.ID, f.Owner, cleanError(reason))
	return s.fenced("park", f, tag, err)
}

// restamp records that the attempt holding f runs the record under
// definition, after recoveryPoint ("" for none), with state (nil keeps
// the stored one).
func (s *Store) restamp(ctx context.Context, f Fence, definition, recoveryPoint string, state []byte) error {
	if err := checkName("definition", definition); err != nil {
		return err
	}
	var point *string
	if recoveryPoint != "" {
		point = &recoveryPoint
	}
	tag, err := s.db.Exec(ctx, s.sql.restamp, f.Key.Tenant, f.Key.ID, f.Owner, definition, point, state)
	return s.fenced("restamp", f, tag, err)
}

// Unpark puts the parked record f names (its owner token as read) back in
// flight, to run under the workflow definition whose fingerprint is
// definition (Record.ResumeAs): the next claim of the key, or the
// completer, takes it over and resumes it after its recovery point under
// that definition, reading its state through that definition's state
// upgrader when another definition wrote it. A process that does not
// register that definition parks the record again, and the choice is spent:
// a release then tries the rules. note is
// kept as the last error. It returns ErrLeaseLost when the record is no
// longer parked under that owner token (another operator acted first).
// Check first that definition can run the record: onceflow keys resume
// and workflow.Engine.ResumeAs do.
func (s *Store) Unpark(ctx context.Context, f Fence, definition, note string) error {
	if err := checkName("definition", definition); err != nil {
		return err
	}
	tag, err := s.db.Exec(ctx, s.sql.unpark, f.Key.Tenant, f.Key.ID, f.Owner, definition, cleanError(note))
	return s.fenced("unpark", f, tag, err)
}
