package phase

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/seam/hooks"
)

// engineStep is the engine's view of a Step: the calls that check and run
// it, which only the workflow engine makes. Package seam hands it to the
// engine, so that go doc phase.Step shows what a workflow's author uses.
type engineStep[Req, State any] Step[Req, State]

// engineView is satisfied by every Step[Req, State].
type engineView interface{ engine() any }

func init() {
	hooks.Step = func(s any) any { return s.(engineView).engine() }
}

func (s Step[Req, State]) engine() any { return engineStep[Req, State](s) }

func (e engineStep[Req, State]) Valid() error { return Step[Req, State](e).valid() }

func (e engineStep[Req, State]) RunAtomic(ctx context.Context, tx pgx.Tx, r *Run[Req, State]) error {
	return Step[Req, State](e).runAtomic(ctx, tx, r)
}

func (e engineStep[Req, State]) RunForeign(ctx context.Context, r *Run[Req, State]) error {
	return Step[Req, State](e).runForeign(ctx, r)
}

func (e engineStep[Req, State]) Compensable() bool { return Step[Req, State](e).Compensable() }

func (e engineStep[Req, State]) RunCompensation(ctx context.Context, r *Run[Req, State]) error {
	return Step[Req, State](e).runCompensation(ctx, r)
}
