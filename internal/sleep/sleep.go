// Package sleep waits for a duration or for a context, whichever ends first:
// the one place the engine, the client and the examples pause.
package sleep

import (
	"context"
	"time"
)

// For waits d, or until ctx ends. It returns nil when d passed, and
// otherwise ctx's cause (context.Cause), so that a caller can tell a
// deadline from a cancellation.
func For(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
