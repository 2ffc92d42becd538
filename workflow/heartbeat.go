package workflow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// heartbeat renews the lease every third of it while a step runs. It
// returns the step's context and a stop function. The context is cancelled
// when a renewal finds the key taken over, or when no renewal has succeeded
// for a whole lease (the database is out of reach, so the lease may have
// ended and another attempt may be running the same step). stop ends the
// heartbeat, waits for it, and returns the lease's loss, if any, marked as
// the engine's own finding. Disabled, it only wraps ctx.
//
// "A whole lease" is measured by runtime timers, on the monotonic clock,
// never by Config.Clock: a clock that jumps back must not keep a step
// running after its lease ended. The timer of each renewal starts before
// the renewal is sent (the database starts the new lease later), and it
// fires even while a renewal hangs, so the step may be cancelled a little
// early, never late.
func (a *attempt[Req, State]) heartbeat(ctx context.Context, step string, enabled bool) (context.Context, func() error) {
	stepCtx, cancel := context.WithCancelCause(ctx)
	if !enabled {
		return stepCtx, func() error { cancel(nil); return nil }
	}
	var lastErr atomic.Pointer[error] // the last failed renewal's error
	expire := func() {
		err := fmt.Errorf("%w: no renewal succeeded for a whole lease (%s)", ErrLeaseLost, a.e.lease)
		if last := lastErr.Load(); last != nil {
			err = fmt.Errorf("%w: %w", err, *last)
		}
		cancel(&lostLease{err})
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	fence := a.rec.Fence()
	wg.Go(func() {
		// The lease was last extended by the claim or commit that preceded
		// the step.
		deadline := time.AfterFunc(a.e.lease, expire)
		defer func() { deadline.Stop() }()
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
			next := time.AfterFunc(a.e.lease, expire) // the end of the lease this renewal asks for, at the latest
			until, err := a.e.store.Renew(stepCtx, fence, 0)
			if a.e.hooks.LeaseRenewed != nil {
				a.e.hooks.LeaseRenewed(a.key, step, until, err)
			}
			if err == nil {
				deadline.Stop()
				deadline = next
				continue
			}
			next.Stop()
			switch {
			case errors.Is(err, ErrLeaseLost):
				cancel(&lostLease{err})
				return
			case stepCtx.Err() != nil:
				return
			}
			lastErr.Store(&err)
			a.e.logger.WarnContext(ctx, "could not renew the lease; will try again", a.logAttrs(step, slog.Any("error", err))...)
		}
	})
	return stepCtx, func() error {
		// Cancel first: a renewal waiting for a connection the step holds
		// must not keep the step from finishing.
		close(done)
		cancel(nil)
		wg.Wait()
		var lost *lostLease
		if errors.As(context.Cause(stepCtx), &lost) {
			return lost
		}
		return nil
	}
}
