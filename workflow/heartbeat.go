package workflow

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/onceflow/onceflow/internal/lease"
	"github.com/onceflow/onceflow/recovery"
)

// keepLease starts keeping the lease this attempt's claim took, sent at
// sent (see package lease for the rule).
func (a *attempt[Req, State]) keepLease(ctx context.Context, sent time.Time) {
	fence := a.rec.Fence()
	a.keeper = lease.New(a.e.lease, sent,
		func(ctx context.Context) (time.Time, error) { return a.e.store.Renew(ctx, fence, 0) },
		func(until time.Time, err error) {
			step := *a.heldStep.Load()
			if a.e.hooks.LeaseRenewed != nil {
				a.e.hooks.LeaseRenewed(a.key, step, until, err)
			}
			if err != nil && !errors.Is(err, recovery.ErrLeaseLost) {
				a.e.logger.WarnContext(ctx, "could not renew the lease; will try again",
					slog.String("workflow", a.w.name), slog.String("tenant", a.key.Tenant), slog.String("key", a.key.ID),
					slog.String("step", step), slog.Any("error", err))
			}
		})
}

// heartbeat keeps the lease while a step runs. It returns the step's
// context, cancelled when a renewal finds the key taken over or when no
// extension of the lease succeeded for (nearly) a whole lease, counted
// from the last one this attempt made, whichever step made it; and a stop
// function that returns that loss, marked as the engine's own finding.
// Disabled (the claim is uncommitted and holds the key's lock, so no
// takeover is possible), it only wraps ctx.
func (a *attempt[Req, State]) heartbeat(ctx context.Context, step string, enabled bool) (context.Context, func() error) {
	a.heldStep.Store(&step) // read by the renewals, which run beside the step
	if !enabled {
		stepCtx, cancel := context.WithCancel(ctx)
		return stepCtx, func() error { cancel(); return nil }
	}
	stepCtx, stop := a.keeper.Hold(ctx)
	return stepCtx, func() error {
		if lost := stop(); lost != nil {
			return &lostLease{lost}
		}
		return nil
	}
}
