package recovery

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// ListFilter selects records for operators. Zero fields match everything.
type ListFilter struct {
	Tenant string
	// Workflow selects the records of one workflow (or middleware route).
	Workflow string
	Status   Status
	// Compensating selects records in flight whose compensations are
	// running (Record.Compensating).
	Compensating bool
	// StuckFor selects records in flight that made no progress (no claim,
	// commit or renewal) for longer than this.
	StuckFor time.Duration
	// CreatedFrom and CreatedTo select records created at or after
	// CreatedFrom and before CreatedTo; a zero time leaves that end open.
	CreatedFrom, CreatedTo time.Time
	// Newest lists the most recently updated first; the default is the
	// least recently updated first.
	Newest bool
	// After continues a listing: only records after this position in the
	// listing's order are returned (keyset pagination). nil starts at the
	// beginning.
	After *ListPosition
	// Limit caps the result; 0 means 100.
	Limit int
}

// ListPosition is a record's place in a listing, which is ordered by
// (UpdatedAt, tenant, key): Position of the last record of a page
// continues the listing after it.
type ListPosition struct {
	UpdatedAt time.Time
	Key       Key
}

// Position returns r's place in a listing (ListFilter.After).
func (r *Record) Position() ListPosition { return ListPosition{UpdatedAt: r.UpdatedAt, Key: r.Key} }

// List returns records matching f, least recently updated first (unless
// f.Newest): what an operator looks at when something is stuck. Records
// updated while an operator pages through a listing move in its order: a
// page may miss or repeat them.
func (s *Store) List(ctx context.Context, f ListFilter) ([]*Record, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	sql := s.sql.list
	if f.Newest {
		sql = s.sql.listNewest
	}
	var after pgtype.Timestamptz
	var afterKey Key
	if f.After != nil {
		after = pgtype.Timestamptz{Time: f.After.UpdatedAt, Valid: true}
		afterKey = f.After.Key
	}
	rows, err := s.db.Query(ctx, sql, f.Tenant, string(f.Status), f.StuckFor.Microseconds(), limit,
		f.Workflow, f.Compensating, optionalTime(f.CreatedFrom), optionalTime(f.CreatedTo), after, afterKey.Tenant, afterKey.ID)
	if err != nil {
		return nil, s.dbError("list keys", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Record, error) { return scanRecord(row) })
	if err != nil {
		return nil, s.dbError("list keys", err)
	}
	return recs, nil
}

// optionalTime is t as a parameter, NULL when t is zero.
func optionalTime(t time.Time) pgtype.Timestamptz {
	return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()}
}
