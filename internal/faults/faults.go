// Package faults holds what onceflow's fault-injection tests share: a seeded
// source of randomness whose seed is printed when a test fails, so that a run
// can be replayed, and the switch between the default sizes, which CI runs,
// and the long variants.
//
// Replay a failed run with the seed it printed:
//
//	ONCEFLOW_SEED=12345 go test -run TestName ./examples/checkout
//
// Run the long variants:
//
//	ONCEFLOW_LONG=1 go test -race ./...
package faults

import (
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// SeedEnv names the variable that fixes the seed of every Rand.
const SeedEnv = "ONCEFLOW_SEED"

// LongEnv names the variable that selects the long variants when set to 1.
const LongEnv = "ONCEFLOW_LONG"

// Rand returns a random source for t, seeded from ONCEFLOW_SEED when it is
// set and from the clock otherwise. When t fails, it logs the seed and the
// command that replays it. The source is safe for concurrent use.
func Rand(t testing.TB) *Source {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(SeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want an unsigned integer", SeedEnv, s)
		}
		seed = v
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d: replay with %s=%d go test -run '^%s$'", seed, SeedEnv, seed, t.Name())
		}
	})
	return &Source{seed: seed, r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Source is a seeded random source safe for concurrent use. Draws from
// several goroutines interleave by scheduling, so only the draws a single
// goroutine makes in order replay exactly.
type Source struct {
	seed uint64
	mu   sync.Mutex
	r    *rand.Rand
}

// Seed returns the seed the source started from.
func (s *Source) Seed() uint64 { return s.seed }

// IntN returns a number in [0, n).
func (s *Source) IntN(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.r.IntN(n)
}

// Float64 returns a number in [0, 1).
func (s *Source) Float64() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.r.Float64()
}

// Duration returns a duration in [lo, hi).
func (s *Source) Duration(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return lo + time.Duration(s.r.Int64N(int64(hi-lo)))
}

// Perm returns a random permutation of [0, n).
func (s *Source) Perm(n int) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.r.Perm(n)
}

// Long reports whether ONCEFLOW_LONG=1 selects the long variants.
func Long() bool { return os.Getenv(LongEnv) == "1" }

// Size returns short by default and long when the long variants run.
func Size[T any](short, long T) T {
	if Long() {
		return long
	}
	return short
}
