package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// tally is what one side did at one concurrency, over all rounds.
type tally struct {
	workflows int64
	took      time.Duration
	commits   int64
	perRound  []float64 // workflows per second, by round
}

func (t tally) rate() float64 { return float64(t.workflows) / t.took.Seconds() }

func (t tally) commitsPerWorkflow() float64 { return float64(t.commits) / float64(t.workflows) }

// keys hands out a side's workflow keys: each is used once in a run.
type keys struct {
	prefix string
	next   atomic.Int64
}

func (k *keys) key() string { return fmt.Sprintf("%s-%d", k.prefix, k.next.Add(1)) }

// runFor runs s's workflows with c workers for about d, each worker
// starting its next workflow when its last is done. It returns the
// workflows done and the time they took, up to the last worker's finish.
func runFor(ctx context.Context, d time.Duration, c int, s *side, k *keys) (int64, time.Duration, error) {
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
				if err := s.run(ctx, k.key()); err != nil {
					once.Do(func() { first = fmt.Errorf("%s: %w", s.name, err) })
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	return done.Load(), time.Since(started), first
}

// measure runs s for d at concurrency c between two readings of its
// database's committed transactions.
func measure(ctx context.Context, srv *server, s *side, k *keys, c int, d time.Duration) (n int64, took time.Duration, commits int64, err error) {
	before, _, err := srv.commits(ctx, s.db)
	if err != nil {
		return 0, 0, 0, err
	}
	n, took, err = runFor(ctx, d, c, s, k)
	if err != nil {
		return 0, 0, 0, err
	}
	after, flushed, err := srv.commits(ctx, s.db)
	return n, took, after - before - int64(flushed), err
}
