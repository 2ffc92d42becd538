package faults

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRandReplaysFromSeed(t *testing.T) {
	t.Setenv(SeedEnv, "42")
	a, b := Rand(t), Rand(t)
	require.Equal(t, uint64(42), a.Seed())
	for range 100 {
		require.Equal(t, a.IntN(1000), b.IntN(1000), "one seed gives one sequence")
	}
}

func TestRandRejectsABadSeed(t *testing.T) {
	t.Setenv(SeedEnv, "forty-two")
	ft := &fatalRecorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		Rand(ft)
	}()
	require.True(t, ft.fatal, "a malformed seed fails the test")
}

type fatalRecorder struct {
	testing.TB
	fatal bool
}

func (f *fatalRecorder) Fatalf(string, ...any) { f.fatal = true; panic("fatal") }

func TestSize(t *testing.T) {
	t.Setenv(LongEnv, "")
	require.Equal(t, 10, Size(10, 1000))
	t.Setenv(LongEnv, "1")
	require.Equal(t, 1000, Size(10, 1000))
}
