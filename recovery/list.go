package recovery

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// ListFilter selects records for operators. Zero fields match everything.
type ListFilter struct {
	Tenant string
	Status Status
	// StuckFor selects records in flight that made no progress (no claim,
	// commit or renewal) for longer than this.
	StuckFor time.Duration
	// Limit caps the result; 0 means 100.
	Limit int
}

// List returns records matching f, least recently updated first: what an
// operator looks at when something is stuck.
func (s *Store) List(ctx context.Context, f ListFilter) ([]*Record, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	rows, err := s.db.Query(ctx, s.sql.list, f.Tenant, string(f.Status), f.StuckFor.Microseconds(), limit)
	if err != nil {
		return nil, s.dbError("list keys", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Record, error) { return scanRecord(row) })
	if err != nil {
		return nil, s.dbError("list keys", err)
	}
	return recs, nil
}
