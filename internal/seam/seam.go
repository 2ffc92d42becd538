// Package seam gives onceflow's own packages what recovery and phase keep
// out of their public API: the Store transitions only the workflow engine,
// the HTTP middleware and the onceflow command make, and the calls that run a step. Users do
// not see them in recovery.Store or phase.Step; internal/ keeps them out
// of reach outside this module.
package seam

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/seam/hooks"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
)

// Conn is one connection that takes statements one at a time or in a
// batch, sent in one round trip: *pgxpool.Conn and *pgx.Conn satisfy it.
type Conn = interface {
	recovery.DBTX
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Store is the engine's view of a *recovery.Store. Each method is the
// recovery method of the same name, lower-cased, which documents it.
type Store interface {
	BeginAndClaim(ctx context.Context, conn Conn, begin []string, mark string, p recovery.ClaimParams) (*recovery.Record, recovery.Outcome, error)
	WithConn(conn recovery.DBTX) *recovery.Store
	CommitUnknown(err error) bool
	AdvanceAndCommit(ctx context.Context, conn Conn, mark string, f recovery.Fence, recoveryPoint string, state []byte) error
	CompleteAndCommit(ctx context.Context, conn Conn, mark string, f recovery.Fence, recoveryPoint string, state []byte, resp recovery.Response) error
	CommitMarked(ctx context.Context, conn Conn, mark string) error
	CompleteAfter(ctx context.Context, f recovery.Fence, recoveryPoint string, state []byte, resp recovery.Response) error
	HandBack(ctx context.Context, f recovery.Fence, cause string) error
	HandBackFor(ctx context.Context, f recovery.Fence, after time.Duration, cause string, counted bool) (time.Time, error)
	ReleaseLeaseOver(ctx context.Context, f recovery.Fence, cause string) error
	FailLeaseOver(ctx context.Context, f recovery.Fence, resp recovery.Response, cause string) error
	ForceRelease(ctx context.Context, f recovery.Fence, cause string) error
	ForceFail(ctx context.Context, f recovery.Fence, resp recovery.Response, cause string) error
	Stored(resp recovery.Response) recovery.Response
	Takeover(ctx context.Context, k recovery.Key, workflow string) (*recovery.Record, recovery.Outcome, error)
	Park(ctx context.Context, f recovery.Fence, reason string) error
	Restamp(ctx context.Context, f recovery.Fence, definition, recoveryPoint string, state []byte) error
	SaveDefinition(ctx context.Context, d recovery.StoredDefinition) error
	Compensate(ctx context.Context, f recovery.Fence, undo []string, resp recovery.Response, state []byte, cause string) error
	Undone(ctx context.Context, f recovery.Fence, step string, state []byte) (bool, error)
}

// StoreOf returns the engine's view of s.
func StoreOf(s *recovery.Store) Store { return hooks.Store(s).(Store) }

// Step is the engine's view of a phase.Step. Each method is the phase
// method of the same name, lower-cased, which documents it.
type Step[Req, State any] interface {
	Valid() error
	RunAtomic(ctx context.Context, tx pgx.Tx, r *phase.Run[Req, State]) error
	RunForeign(ctx context.Context, r *phase.Run[Req, State]) error
	Compensable() bool
	RunCompensation(ctx context.Context, r *phase.Run[Req, State]) error
}

// StepOf returns the engine's view of s.
func StepOf[Req, State any](s phase.Step[Req, State]) Step[Req, State] {
	return hooks.Step(s).(Step[Req, State])
}
