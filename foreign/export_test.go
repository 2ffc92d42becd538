package foreign

import (
	"context"
	"time"

	"github.com/onceflow/onceflow/internal/sleep"
)

// WithSleep replaces the wait between a Mutation's tries with sleep, so
// that a test sees each wait without waiting it.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return sleepOption(sleep)
}

type sleepOption func(ctx context.Context, d time.Duration) error

func (s sleepOption) apply(o *options) { o.sleep = s }

// RetryAfterOf reads a Retry-After header as CheckResponse does, at now.
var RetryAfterOf = retryAfterOf

// SetPacerSleep replaces the waits of p, so that a test sees each wait as
// it happens.
func SetPacerSleep(p *Pacer, sleep func(ctx context.Context, d time.Duration) error) { p.sleep = sleep }

// Sleep is the wait a Pacer makes by default.
var Sleep = sleep.For
