package phase

import (
	"context"
	"time"
)

// Pacer paces the calls foreign steps make to other systems
// (foreign.Limit): the engine hands its pacer to every step in Run.Pacer.
// Pace runs call once it may (a free slot, a token of the rate, a closed
// circuit), for downstream and, when that downstream is paced per tenant,
// tenant; it holds no transaction and no connection while it waits. A wait
// longer than a third of lease returns a *DeferError instead of waiting.
type Pacer interface {
	Pace(ctx context.Context, downstream, tenant string, lease time.Duration, call func(ctx context.Context) error) error
}
