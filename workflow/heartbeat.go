package workflow

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// heartbeat renews the lease every third of it while a step runs. It
// returns the step's context, cancelled with ErrLeaseLost if a renewal finds
// the lease taken over, and a stop function that ends the heartbeat, waits
// for it, and returns that loss, if any. Disabled, it only wraps ctx.
func (a *attempt[Req, State]) heartbeat(ctx context.Context, step string, enabled bool) (context.Context, func() error) {
	stepCtx, cancel := context.WithCancelCause(ctx)
	if !enabled {
		return stepCtx, func() error { cancel(nil); return nil }
	}
	var (
		done = make(chan struct{})
		wg   sync.WaitGroup
	)
	fence := a.rec.Fence()
	wg.Go(func() {
		ticker := time.NewTicker(a.e.lease / 3)
		defer ticker.Stop()
		for {
			select {
			case <-done:
				return
			case <-stepCtx.Done():
				return
			case <-ticker.C:
			}
			until, err := a.e.store.Renew(stepCtx, fence, 0)
			if a.e.hooks.LeaseRenewed != nil {
				a.e.hooks.LeaseRenewed(a.key, step, until, err)
			}
			switch {
			case errors.Is(err, ErrLeaseLost):
				cancel(err)
				return
			case err != nil && stepCtx.Err() == nil:
				a.e.logger.WarnContext(ctx, "could not renew the lease; will try again", a.logAttrs(step, slog.Any("error", err))...)
			}
		}
	})
	return stepCtx, func() error {
		close(done)
		wg.Wait()
		lost := context.Cause(stepCtx)
		cancel(nil)
		if errors.Is(lost, ErrLeaseLost) {
			return lost
		}
		return nil
	}
}
