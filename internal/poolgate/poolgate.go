// Package poolgate keeps the last of a pool's connections from the work
// that holds connections for long: a workflow's attempts, which hold one
// through an atomic phase, and idemhttp's Atomic requests, which hold one
// through their handler. What must still get a connection then (a lease
// renewal, a second connection a handler takes from the same pool) waits
// at most for one to come back, instead of behind every holder: a pool
// whose every connection is held, with more holders queued behind them,
// would otherwise keep a renewal waiting until its lease runs out, or
// deadlock handlers that each wait for a second connection.
//
// A pool has one gate, whoever asks for it (For): an engine and a
// middleware on the same pool share its places, so that together, too,
// they leave the last connection free.
package poolgate

import (
	"context"
	"runtime"
	"sync"
	"weak"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Gate admits at most one fewer holder than a pool's connections. A nil
// Gate (a pool that does not report its size, or a pool of one
// connection) admits every holder.
type Gate chan struct{}

// gates holds the gate of each pool For was asked about, by a weak pointer
// to the pool: the entry of a pool nothing else references any more (a
// closed pool, dropped) is deleted by a cleanup, so that a process that
// makes pools over and over does not keep their gates.
var gates sync.Map // weak.Pointer[pgxpool.Pool] → Gate

// For returns the gate of db: the same Gate for every caller that passes
// the same *pgxpool.Pool, made on first use (New). Any other db (a type
// that wraps a pool, say) gets a gate of its own, shared with no one.
func For(db any) Gate {
	pool, ok := db.(*pgxpool.Pool)
	if !ok || pool == nil {
		return New(db)
	}
	key := weak.Make(pool)
	if g, ok := gates.Load(key); ok {
		return g.(Gate)
	}
	g, loaded := gates.LoadOrStore(key, New(pool))
	if !loaded {
		runtime.AddCleanup(pool, func(key weak.Pointer[pgxpool.Pool]) { gates.Delete(key) }, key)
	}
	return g.(Gate)
}

// New returns a new gate for db: MaxConns-1 places when db is a pool that
// reports its size (*pgxpool.Pool) and has at least two connections. Use
// For, which shares one gate among every user of a pool.
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
