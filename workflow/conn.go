package workflow

import (
	"cmp"
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/poolgate"
)

// workConn is a connection an attempt took through the engine's gate:
// Release hands back both the connection and its place.
type workConn struct {
	*pgxpool.Conn
	gate poolgate.Gate // keeps the pool's last connection for renewals
	once sync.Once
}

// Release returns the connection to the pool and the place to the gate. A
// second call does nothing.
func (c *workConn) Release() {
	c.once.Do(func() {
		c.Conn.Release()
		c.gate.Leave()
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
	if err := e.gate.Enter(ctx); err != nil {
		return nil, err
	}
	conn, err := e.db.Acquire(ctx)
	if err != nil {
		e.gate.Leave()
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
