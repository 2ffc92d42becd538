package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onceflow/onceflow/recovery"
)

// op is one operation; i numbers operations uniquely within a side.
type op func(ctx context.Context, i int64) error

// errGaveUp is an operation's error that does not end a run: the
// operation did not complete and is not counted (see contention).
var errGaveUp = errors.New("operation gave up")

// gaveUpNote says how many claims gave up, if any did.
func gaveUpNote(n int64) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%d claims gave up on a row lock (lock_timeout), not counted", n)
}

// contention returns fn, but a claim that gave up waiting for a row lock
// (recovery.InFlightError.Contended, on an overloaded server) is counted
// in gaveUp and does not end the run: an application would retry it.
func contention(fn op, gaveUp *atomic.Int64) op {
	return func(ctx context.Context, i int64) error {
		err := fn(ctx, i)
		var inFlight *recovery.InFlightError
		if errors.As(err, &inFlight) && inFlight.Contended {
			gaveUp.Add(1)
			return errGaveUp
		}
		return err
	}
}

// throughput runs the two sides in alternation, rounds times, each for d
// with c workers, and returns operations per second for each, and how
// many claims gave up on a row lock (see contention).
func throughput(ctx context.Context, rounds int, d time.Duration, c int, onceflow, floor op) (float64, float64, int64, error) {
	var gaveUp atomic.Int64
	onceflow, floor = contention(onceflow, &gaveUp), contention(floor, &gaveUp)
	var (
		next         atomic.Int64
		opsO, opsF   int64
		timeO, timeF time.Duration
	)
	for range rounds {
		for _, side := range []struct {
			run  op
			ops  *int64
			took *time.Duration
		}{{onceflow, &opsO, &timeO}, {floor, &opsF, &timeF}} {
			n, took, err := runFor(ctx, d, c, side.run, &next)
			if err != nil {
				return 0, 0, 0, err
			}
			*side.ops += n
			*side.took += took
		}
	}
	return float64(opsO) / timeO.Seconds(), float64(opsF) / timeF.Seconds(), gaveUp.Load(), nil
}

// runFor runs fn with c workers for about d and returns the operations done.
func runFor(ctx context.Context, d time.Duration, c int, fn op, next *atomic.Int64) (int64, time.Duration, error) {
	var (
		wg    sync.WaitGroup
		done  atomic.Int64
		first error
		once  sync.Once
	)
	started := time.Now()
	deadline := started.Add(d)
	for range c {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				err := fn(ctx, next.Add(1))
				if errors.Is(err, errGaveUp) {
					continue
				}
				if err != nil {
					once.Do(func() { first = err })
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	return done.Load(), time.Since(started), first
}

// latencies runs fn n times, one after another, and returns each duration.
func latencies(ctx context.Context, n int, fn op, next *atomic.Int64) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for range n {
		started := time.Now()
		if err := fn(ctx, next.Add(1)); err != nil {
			return nil, err
		}
		out = append(out, time.Since(started))
	}
	return out, nil
}

// percentile returns the p-th percentile (0 < p <= 100) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	i := int(float64(len(sorted))*p/100+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
