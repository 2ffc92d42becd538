package recovery

import (
	"context"
	"time"

	"github.com/onceflow/onceflow/internal/seam/hooks"
)

// engineStore is the engine's view of a Store: the transitions only
// onceflow's workflow engine, HTTP middleware and operator command make. Package seam hands
// it to them, so that the Store users see keeps to what users call.
type engineStore Store

func init() {
	hooks.Store = func(s any) any { return (*engineStore)(s.(*Store)) }
}

func (e *engineStore) store() *Store { return (*Store)(e) }

func (e *engineStore) BeginAndClaim(ctx context.Context, conn batchConn, begin []string, mark string, p ClaimParams) (*Record, Outcome, error) {
	return e.store().beginAndClaim(ctx, conn, begin, mark, p)
}

func (e *engineStore) WithConn(conn DBTX) *Store { return e.store().withConn(conn) }

func (e *engineStore) CommitUnknown(err error) bool { return commitUnknown(err) }

func (e *engineStore) AdvanceAndCommit(ctx context.Context, conn batchConn, mark string, f Fence, recoveryPoint string, state []byte) error {
	return e.store().advanceAndCommit(ctx, conn, mark, f, recoveryPoint, state)
}

func (e *engineStore) CompleteAndCommit(ctx context.Context, conn batchConn, mark string, f Fence, recoveryPoint string, state []byte, resp Response) error {
	return e.store().completeAndCommit(ctx, conn, mark, f, recoveryPoint, state, resp)
}

func (e *engineStore) CommitMarked(ctx context.Context, conn batchConn, mark string) error {
	return e.store().commitMarked(ctx, conn, mark)
}

func (e *engineStore) CompleteAfter(ctx context.Context, f Fence, recoveryPoint string, state []byte, resp Response) error {
	return e.store().completeAfter(ctx, f, recoveryPoint, state, resp)
}

func (e *engineStore) HandBack(ctx context.Context, f Fence, cause string) error {
	return e.store().handBack(ctx, f, cause)
}

func (e *engineStore) HandBackFor(ctx context.Context, f Fence, after time.Duration, cause string, counted bool) (time.Time, error) {
	return e.store().handBackFor(ctx, f, after, cause, counted)
}

func (e *engineStore) ReleaseLeaseOver(ctx context.Context, f Fence, cause string) error {
	return e.store().releaseLeaseOver(ctx, f, cause)
}

func (e *engineStore) FailLeaseOver(ctx context.Context, f Fence, resp Response, cause string) error {
	return e.store().failLeaseOver(ctx, f, resp, cause)
}

func (e *engineStore) ForceRelease(ctx context.Context, f Fence, cause string) error {
	return e.store().forceRelease(ctx, f, cause)
}

func (e *engineStore) ForceFail(ctx context.Context, f Fence, resp Response, cause string) error {
	return e.store().forceFail(ctx, f, resp, cause)
}

func (e *engineStore) Stored(resp Response) Response { return e.store().stored(resp) }

func (e *engineStore) Takeover(ctx context.Context, k Key, workflow string) (*Record, Outcome, error) {
	return e.store().takeover(ctx, k, workflow)
}

func (e *engineStore) Park(ctx context.Context, f Fence, reason string) error {
	return e.store().park(ctx, f, reason)
}

func (e *engineStore) Restamp(ctx context.Context, f Fence, definition, recoveryPoint string, state []byte) error {
	return e.store().restamp(ctx, f, definition, recoveryPoint, state)
}

func (e *engineStore) SaveDefinition(ctx context.Context, d StoredDefinition) error {
	return e.store().saveDefinition(ctx, d)
}

func (e *engineStore) Compensate(ctx context.Context, f Fence, undo []string, resp Response, state []byte, cause string) error {
	return e.store().compensate(ctx, f, undo, resp, state, cause)
}

func (e *engineStore) Undone(ctx context.Context, f Fence, step string, state []byte) (bool, error) {
	return e.store().undone(ctx, f, step, state)
}
