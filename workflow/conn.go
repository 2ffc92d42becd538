package workflow

import (
	"cmp"
	"context"
	"sync"
	"time"

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

// acquire takes a connection for an attempt's work, through the gate. A
// connection kept after a replay (keptConn) is taken first, its
// transaction rolled back.
func (e *Engine) acquire(ctx context.Context) (*workConn, error) {
	if conn := e.kept.take(); conn != nil {
		if _, err := conn.Exec(ctx, "rollback"); err != nil {
			conn.Release() // the pool drops a connection left in a transaction
			return nil, err
		}
		return conn, nil
	}
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

// keptFor is how long a replay's connection waits, its read-only
// transaction open, for the next claim to end that transaction in its own
// round trip; past it the connection is rolled back and released.
const keptFor = 5 * time.Millisecond

// keptConn holds at most one connection whose transaction a replay left
// open. The claim opens the first phase's transaction (BEGIN and the claim
// in one round trip); for a finished key it wrote nothing, and ending that
// transaction on its own would cost a round trip per replay. Kept, the
// transaction is ended by the next pipelined claim, whose batch starts
// with the ROLLBACK: a replay in a steady stream of claims costs one round
// trip. The transaction holds no snapshot between statements (READ
// COMMITTED) and no row lock; the ACCESS SHARE lock its read took on
// onceflow_keys delays only DDL on the table (a migration), by keptFor at
// most. The connection keeps its place at the gate meanwhile, and acquire
// takes it before waiting at the gate.
type keptConn struct {
	mu    sync.Mutex
	conn  *workConn
	timer *time.Timer
	// keepFor is how long a connection is kept: keptFor, unless a test
	// set it (0 means keptFor).
	keepFor time.Duration
}

// keep keeps conn, whose read-only transaction is open, or ends that
// transaction off the caller's path when a connection is kept already.
func (k *keptConn) keep(conn *workConn) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.conn != nil {
		go endReadOnly(conn)
		return
	}
	k.conn = conn
	d := cmp.Or(k.keepFor, keptFor)
	if k.timer == nil {
		k.timer = time.AfterFunc(d, k.expire)
	} else {
		k.timer.Reset(d)
	}
}

// take returns the kept connection, its transaction still open, or nil.
func (k *keptConn) take() *workConn {
	k.mu.Lock()
	defer k.mu.Unlock()
	conn := k.conn
	if conn != nil {
		k.conn = nil
		k.timer.Stop()
	}
	return conn
}

// expire ends the kept connection's transaction and releases it.
func (k *keptConn) expire() {
	if conn := k.take(); conn != nil {
		endReadOnly(conn)
	}
}
