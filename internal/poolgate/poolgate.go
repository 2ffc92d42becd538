// Package poolgate keeps the last of a pool's connections from the work
// that holds connections for long: a workflow's attempts, which hold one
// through an atomic phase, and idemhttp's Atomic requests, which hold one
// through their handler. What must still get a connection then (a lease
// renewal, a second connection a handler takes from the same pool) waits
// at most for one to come back, instead of behind every holder: a pool
// whose every connection is held, with more holders queued behind them,
// would otherwise keep a renewal waiting until its lease runs out, or
// deadlock handlers that each wait for a second connection.
package poolgate

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Gate admits at most one fewer holder than a pool's connections. A nil
// Gate (a pool that does not report its size, or a pool of one
// connection) admits every holder.
type Gate chan struct{}

// New returns the gate for db: MaxConns-1 places when db is a pool that
// reports its size (*pgxpool.Pool) and has at least two connections.
func New(db any) Gate {
	sized, ok := db.(interface{ Stat() *pgxpool.Stat })
	if !ok {
		return nil
	}
	if n := sized.Stat().MaxConns(); n >= 2 {
		return make(Gate, n-1)
	}
	return nil
}

// Enter takes a place, waiting for one until ctx ends.
func (g Gate) Enter(ctx context.Context) error {
	if g == nil {
		return nil
	}
	select {
	case g <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Leave gives a place back.
func (g Gate) Leave() {
	if g != nil {
		<-g
	}
}
