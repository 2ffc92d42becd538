package workflow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// heartbeat renews the lease every third of it while a step runs. It
// returns the step's context and a stop function. The context is cancelled
// when a renewal finds the key taken over, or when no renewal has succeeded
// for a whole lease (the database is out of reach, so the lease may have
// ended and another attempt may be running the same step). stop ends the
// heartbeat, waits for it, and returns the lease's loss, if any, marked as
// the engine's own finding. Disabled, it only wraps ctx.
func (a *attempt[Req, State]) heartbeat(ctx context.Context, step string, enabled bool) (context.Context, func() error) {
	stepCtx, cancel := context.WithCancelCause(ctx)
	if !enabled {
		return stepCtx, func() error { cancel(nil); return nil }
	}
	var (
		done = make(chan struct{})
		wg   sync.WaitGroup
		lost error // set by the heartbeat goroutine, read after it ends
	)
	fence := a.rec.Fence()
	wg.Go(func() {
		ticker := time.NewTicker(a.e.lease / 3)
		defer ticker.Stop()
		renewed := time.Now() // the claim or commit that preceded the step
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
			case err == nil:
				renewed = time.Now()
			case errors.Is(err, ErrLeaseLost):
				lost = &lostLease{err}
			case stepCtx.Err() != nil:
				return
			case time.Since(renewed) >= a.e.lease:
				lost = &lostLease{fmt.Errorf("%w: no renewal succeeded for a whole lease (%s): %w", ErrLeaseLost, a.e.lease, err)}
			default:
				a.e.logger.WarnContext(ctx, "could not renew the lease; will try again", a.logAttrs(step, slog.Any("error", err))...)
				continue
			}
			if lost != nil {
				cancel(lost)
				return
			}
		}
	})
	return stepCtx, func() error {
		// Cancel first: a renewal waiting for a connection the step holds
		// must not keep the step from finishing.
		close(done)
		cancel(nil)
		wg.Wait()
		return lost
	}
}
