package workflow

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
)

// workGate keeps the last of a pool's connections from the engine's
// attempts, for the statements that keep leases alive: renewals, hand-backs
// and the fenced writes that record a foreign step. Without it, a pool
// whose every connection is taken by attempts, with more attempts queued
// behind them (duplicates claiming, a burst of retries), makes each
// renewal wait behind that queue: the lease runs out while the process is
// healthy, the attempt is cancelled, its key is taken over and the work is
// done again, over and over (a retry storm that feeds itself). The gate
// holds attempts' connections to one fewer than the pool's MaxConns, so a
// renewal waits at most for one connection to come back.
//
// A nil gate (a DB that does not report its size, or a pool of one
// connection) lets every attempt through.
type workGate chan struct{}

// newWorkGate returns the gate for db: MaxConns-1 places when db is a pool
// that reports its size (*pgxpool.Pool) and has at least two connections.
func newWorkGate(db DB) workGate {
	sized, ok := db.(interface{ Stat() *pgxpool.Stat })
	if !ok {
		return nil
	}
	if n := sized.Stat().MaxConns(); n >= 2 {
		return make(workGate, n-1)
	}
	return nil
}

// enter takes a place, waiting for one until ctx ends.
func (g workGate) enter(ctx context.Context) error {
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

// leave gives a place back.
func (g workGate) leave() {
	if g != nil {
		<-g
	}
}

// workConn is a connection an attempt took through the engine's gate:
// Release hands back both the connection and its place.
type workConn struct {
	*pgxpool.Conn
	gate workGate
	once sync.Once
}

// Release returns the connection to the pool and the place to the gate. A
// second call does nothing.
func (c *workConn) Release() {
	c.once.Do(func() {
		c.Conn.Release()
		c.gate.leave()
	})
}

// acquire takes a connection for an attempt's work, through the gate.
func (e *Engine) acquire(ctx context.Context) (*workConn, error) {
	if err := e.gate.enter(ctx); err != nil {
		return nil, err
	}
	conn, err := e.db.Acquire(ctx)
	if err != nil {
		e.gate.leave()
		return nil, err
	}
	return &workConn{Conn: conn, gate: e.gate}, nil
}
