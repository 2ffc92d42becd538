package workflow

import (
	"context"
	"time"
)

// SetKeptFor sets how long e keeps a replay's connection for the next
// claim (0: keptFor). Call it while e runs nothing.
func SetKeptFor(e *Engine, d time.Duration) {
	e.kept.mu.Lock()
	defer e.kept.mu.Unlock()
	e.kept.keepFor = d
}

// HoldWorkPlaces takes every connection e lets its attempts hold at once
// (the engine's poolgate.Gate), as attempts in their phases would, and returns how many it
// took and a function that gives them back.
func HoldWorkPlaces(ctx context.Context, e *Engine) (int, func(), error) {
	var held []*workConn
	release := func() {
		for _, c := range held {
			c.Release()
		}
	}
	for range cap(e.gate) {
		c, err := e.acquire(ctx)
		if err != nil {
			release()
			return 0, nil, err
		}
		held = append(held, c)
	}
	return len(held), release, nil
}
