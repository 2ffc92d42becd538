package poolgate

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// newPool returns a pool of n connections that never connects: the gate
// reads only its size.
func newPool(t *testing.T, n int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none")
	require.NoError(t, err)
	cfg.MaxConns = n
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	return pool
}

func entries() int {
	n := 0
	gates.Range(func(any, any) bool { n++; return true })
	return n
}

// TestForSharesAPoolsGate: every caller asking for the gate of one pool
// gets the same one, another pool has its own, and a wrapper of a pool
// gets a gate of its own.
func TestForSharesAPoolsGate(t *testing.T) {
	a, b := newPool(t, 4), newPool(t, 4)
	defer a.Close()
	defer b.Close()
	gate := For(a)
	require.Equal(t, 3, cap(gate))
	require.True(t, gate == For(a), "one gate per pool")
	require.False(t, For(a) == For(b), "a gate per pool")
	wrapped := struct{ *pgxpool.Pool }{a}
	require.Equal(t, 3, cap(For(wrapped)))
	require.False(t, For(wrapped) == For(a), "a wrapper is not known to be the pool")
	one := newPool(t, 1)
	defer one.Close()
	require.Nil(t, For(one), "a pool of one connection is shared")
}

// TestForForgetsAPoolNoOneHolds: the gate of a pool that nothing
// references any more is dropped, so that making pools over and over keeps
// no gates.
func TestForForgetsAPoolNoOneHolds(t *testing.T) {
	before := entries()
	// The pools are unreachable once it returns.
	made := func() int {
		pools := make([]*pgxpool.Pool, 10)
		for i := range pools {
			pools[i] = newPool(t, 4)
			For(pools[i])
		}
		defer func() {
			for _, pool := range pools {
				pool.Close()
			}
		}()
		return entries() - before
	}()
	require.Equal(t, 10, made)
	require.Eventually(t, func() bool {
		runtime.GC()
		return entries() <= before
	}, 10*time.Second, 10*time.Millisecond, "the gates of unreachable pools are deleted")
}
