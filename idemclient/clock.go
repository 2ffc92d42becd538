package idemclient

import (
	"context"
	"time"

	"github.com/onceflow/onceflow/internal/sleep"
)

// clock is the Client's time: the wall clock, or a fake in tests, so
// that they need not sleep through backoffs and Retry-After.
type clock interface {
	Now() time.Time
	// Sleep returns after d, or with ctx's cause when ctx is done first.
	Sleep(ctx context.Context, d time.Duration) error
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) Sleep(ctx context.Context, d time.Duration) error { return sleep.For(ctx, d) }
