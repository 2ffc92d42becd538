package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// skewedClock is a process clock off from the machine's by an offset that a
// test may change mid-run. Its readings carry no monotonic part, as a wall
// clock's do not.
type skewedClock struct{ offset atomic.Int64 }

func newSkewedClock(offset time.Duration) *skewedClock {
	c := &skewedClock{}
	c.offset.Store(int64(offset))
	return c
}

func (c *skewedClock) Now() time.Time {
	return time.Now().Round(0).Add(time.Duration(c.offset.Load()))
}

func (c *skewedClock) jump(d time.Duration) { c.offset.Add(int64(d)) }

// clockSkews are the ways the process's clock is off in these tests.
var clockSkews = []struct {
	name           string
	holder, client time.Duration
}{
	{"holder an hour behind, client an hour ahead", -time.Hour, time.Hour},
	{"holder an hour ahead, client an hour behind", time.Hour, -time.Hour},
}

// TestSkewedClockDoesNotTakeOverAValidLease: a client whose clock is an hour
// off finds a key held by a live attempt in flight, with a Retry-After that
// is the lease's remaining time by the database clock; the holder keeps the
// key. A lease computed or judged by a local clock would be an hour expired
// (taken over) or an hour long (Retry-After of an hour).
func TestSkewedClockDoesNotTakeOverAValidLease(t *testing.T) {
	for _, skew := range clockSkews {
		t.Run(skew.name, func(t *testing.T) {
			w := newWorld(t)
			const lease = time.Minute
			entered, release := make(chan struct{}), make(chan struct{})
			w.before = func(_ context.Context, step string) error {
				if step == "charge" {
					close(entered)
					<-release
				}
				return nil
			}
			wf := w.checkout()
			holder := w.engine(workflow.Config{Lease: lease, Clock: newSkewedClock(skew.holder).Now})
			client := w.engine(workflow.Config{Lease: lease, Clock: newSkewedClock(skew.client).Now})
			done := make(chan error, 1)
			go func() {
				_, err := holder.Run(w.ctx, acme, wf, order)
				done <- err
			}()
			<-entered
			held, err := client.Store().Load(w.ctx, acme)
			require.NoError(t, err)

			_, err = client.Run(w.ctx, acme, wf, order)
			require.ErrorIs(t, err, workflow.ErrInFlight, "a valid lease is not taken over")
			var inFlight *recovery.InFlightError
			require.ErrorAs(t, err, &inFlight)
			require.LessOrEqual(t, inFlight.RetryAfter, lease, "Retry-After is what is left of the lease, not an hour")
			require.Greater(t, inFlight.RetryAfter, lease/2, "Retry-After is what is left of the lease, not the minimum")
			_, err = client.Resume(w.ctx, acme)
			require.ErrorIs(t, err, workflow.ErrInFlight, "a sweeper with a skewed clock does not take it over either")

			now, err := client.Store().Load(w.ctx, acme)
			require.NoError(t, err)
			require.Equal(t, held.Owner, now.Owner, "the holder keeps the key")
			require.Zero(t, now.Attempts)

			close(release)
			require.NoError(t, <-done)
			require.Equal(t, 1, w.orders())
			require.Equal(t, 1, w.provider.Effects())
		})
	}
}

// TestSkewedClockTakesOverAnExpiredLease: once the lease of a crashed
// attempt has expired by the database clock, a client whose clock is an
// hour off takes the key over and finishes it once; until then it gets
// ErrInFlight. A released lease (a failed attempt) is taken over at once.
func TestSkewedClockTakesOverAnExpiredLease(t *testing.T) {
	for _, skew := range clockSkews {
		t.Run(skew.name, func(t *testing.T) {
			w := newWorld(t)
			wf := w.checkout()
			crashing := w.engine(workflow.Config{Clock: newSkewedClock(skew.holder).Now,
				Hooks: crashAt(workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"})})
			_, err := crashing.Run(w.ctx, acme, wf, order)
			require.ErrorIs(t, err, workflow.ErrCrashed)

			client := w.engine(workflow.Config{Clock: newSkewedClock(skew.client).Now})
			_, err = client.Run(w.ctx, acme, wf, order)
			require.ErrorIs(t, err, workflow.ErrInFlight, "the crashed attempt's lease still holds")
			require.NoError(t, client.Store().ExpireLease(w.ctx, acme))
			res, err := client.Run(w.ctx, acme, wf, order)
			require.NoError(t, err)
			require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
			require.Equal(t, "create_order", res.ResumedFrom)
			require.Equal(t, 201, res.Response.Status)
			require.Equal(t, 1, w.orders())
			require.Equal(t, 1, w.provider.Effects())

			// A failure releases the lease: no expiry to wait for.
			other := workflow.Key{Tenant: "acme", ID: "order-2"}
			failures := 1
			w.before = func(_ context.Context, step string) error {
				if step == "charge" && failures > 0 {
					failures--
					return errors.New("provider down")
				}
				return nil
			}
			_, err = w.engine(workflow.Config{Clock: newSkewedClock(skew.holder).Now}).Run(w.ctx, other, wf, order)
			require.ErrorContains(t, err, "provider down")
			res, err = client.Run(w.ctx, other, wf, order)
			require.NoError(t, err)
			require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
			require.Equal(t, 2, w.orders())
		})
	}
}

// TestSkewedClockReplaysFinishedRecords: a record finished under one clock
// replays, verbatim, to clients whose clocks are an hour ahead and behind.
func TestSkewedClockReplaysFinishedRecords(t *testing.T) {
	w := newWorld(t)
	wf := w.checkout()
	first, err := w.engine(workflow.Config{Clock: newSkewedClock(time.Hour).Now}).Run(w.ctx, acme, wf, order)
	require.NoError(t, err)
	for _, skew := range []time.Duration{-time.Hour, time.Hour} {
		res, err := w.engine(workflow.Config{Clock: newSkewedClock(skew).Now}).Run(w.ctx, acme, wf, order)
		require.NoError(t, err)
		require.True(t, res.Replayed, "skew %s", skew)
		require.Equal(t, first.Response, res.Response)
	}
	require.Equal(t, 1, w.orders())
	require.Equal(t, 1, w.provider.Effects())
}

// TestHeartbeatRenewsUnderSkewedClock: with the process's clock an hour
// ahead, an hour behind, or jumping an hour either way mid-step, the
// heartbeat renews a long step's lease, the step is not cancelled, and each
// renewal's end is by the database clock.
func TestHeartbeatRenewsUnderSkewedClock(t *testing.T) {
	cases := []struct {
		name         string
		offset, jump time.Duration // jump: at the first renewal
	}{
		{"an hour ahead", time.Hour, 0},
		{"an hour behind", -time.Hour, 0},
		{"jumps an hour ahead", 0, time.Hour},
		{"jumps an hour back", 0, -time.Hour},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			const lease = 900 * time.Millisecond
			clock := newSkewedClock(tc.offset)
			renewed := make(chan time.Time, 16)
			hooks := &workflow.Hooks{LeaseRenewed: func(_ workflow.Key, step string, until time.Time, err error) {
				if err == nil && step == "slow" {
					renewed <- until
				}
			}}
			wf := workflow.Define("slow", foreign.Mutation("slow", func(ctx context.Context, _ *foreign.Call[Order, Paid]) error {
				return awaitRenewals(ctx, renewed, 2, func(int) { clock.jump(tc.jump) })
			}))
			e := w.engine(workflow.Config{Lease: lease, Hooks: hooks, Clock: clock.Now})
			res, err := e.Run(w.ctx, acme, wf, order)
			require.NoError(t, err, "the step was not cancelled")
			require.Equal(t, 200, res.Response.Status)
		})
	}
}

// awaitRenewals waits until n renewals arrived on renewed, calling
// onFirst after the first, and checks that each moved the lease and ended
// it by the database clock (the machine's, within a lease): a lease
// computed from a skewed local clock would be an hour off.
func awaitRenewals(ctx context.Context, renewed <-chan time.Time, n int, onFirst func(int)) error {
	var seen []time.Time
	for len(seen) < n {
		select {
		case until := <-renewed:
			if d := time.Until(until); d < -time.Minute || d > time.Minute {
				return fmt.Errorf("the lease ends %s from now: not by the database clock", d)
			}
			if len(seen) > 0 && !until.After(seen[len(seen)-1]) {
				return errors.New("a renewal did not move the lease")
			}
			seen = append(seen, until)
			if len(seen) == 1 {
				onFirst(1)
			}
		case <-ctx.Done():
			return fmt.Errorf("the step was cancelled after %d renewals: %w", len(seen), context.Cause(ctx))
		case <-time.After(30 * time.Second):
			return fmt.Errorf("only %d renewals came", len(seen))
		}
	}
	return nil
}

// TestClockJumpingBackDoesNotKeepAStepPastItsLease: renewals fail (the
// database is out of reach) and, at the first failure, the process's clock
// jumps back an hour: the step is still cancelled once a whole lease passed
// without a renewal. A heartbeat that measured that lease with the local
// clock would keep the step running for an hour, while another attempt
// takes the key over and runs the same step.
func TestClockJumpingBackDoesNotKeepAStepPastItsLease(t *testing.T) {
	w := newWorld(t)
	db := &failingRenewals{Pool: w.db}
	clock := newSkewedClock(0)
	var jumped atomic.Bool
	hooks := &workflow.Hooks{LeaseRenewed: func(_ workflow.Key, _ string, _ time.Time, err error) {
		if err != nil && !jumped.Swap(true) {
			clock.jump(-time.Hour)
		}
	}}
	wf := workflow.Define("long_call",
		foreign.Mutation("call", func(ctx context.Context, _ *foreign.Call[Order, Paid]) error {
			db.fail.Store(true)
			<-ctx.Done()
			return context.Cause(ctx)
		}))
	e, err := workflow.NewEngine(db, workflow.Config{Lease: 900 * time.Millisecond, Clock: clock.Now, Hooks: hooks})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(w.ctx, 20*time.Second)
	defer cancel()
	_, err = e.Run(ctx, acme, wf, order)
	require.True(t, jumped.Load(), "the clock jumped while renewals failed")
	require.ErrorIs(t, err, workflow.ErrLeaseLost, "the step ran until its caller gave up")
	require.ErrorContains(t, err, "no renewal succeeded for a whole lease")
	require.ErrorContains(t, err, "connection refused", "the renewals' error is kept")
}

// stalledRenewals makes lease renewals hang until their context ends once
// stall is set, as a database that stopped answering (no reset, no error)
// would.
type stalledRenewals struct {
	*pgxpool.Pool
	stall, stalled atomic.Bool
}

func (s *stalledRenewals) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if s.stall.Load() && strings.Contains(sql, "RETURNING locked_until") {
		s.stalled.Store(true)
		<-ctx.Done()
		return errRow{ctx.Err()}
	}
	return s.Pool.QueryRow(ctx, sql, args...)
}

// TestHangingRenewalStopsTheStep: a renewal that never returns must not keep
// the step running past its lease: the step is cancelled a lease after the
// last renewal was sent, while that renewal still hangs.
func TestHangingRenewalStopsTheStep(t *testing.T) {
	w := newWorld(t)
	db := &stalledRenewals{Pool: w.db}
	wf := workflow.Define("long_call",
		foreign.Mutation("call", func(ctx context.Context, _ *foreign.Call[Order, Paid]) error {
			db.stall.Store(true)
			<-ctx.Done()
			return context.Cause(ctx)
		}))
	e, err := workflow.NewEngine(db, workflow.Config{Lease: 900 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(w.ctx, 20*time.Second)
	defer cancel()
	_, err = e.Run(ctx, acme, wf, order)
	require.ErrorIs(t, err, workflow.ErrLeaseLost, "the step ran until its caller gave up")
	require.ErrorContains(t, err, "no renewal succeeded for a whole lease")
	require.True(t, db.stalled.Load(), "a renewal hung")
}

// TestStepDurationsAreReadFromTheClock: the durations told to the Observer
// are read from Config.Clock, here a clock that moves a minute per reading.
func TestStepDurationsAreReadFromTheClock(t *testing.T) {
	w := newWorld(t)
	var (
		mu       sync.Mutex
		readings int
		base     = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		readings++
		return base.Add(time.Duration(readings) * time.Minute)
	}
	obs := &stepTimes{}
	e := w.engine(workflow.Config{Clock: clock, Observer: obs})
	_, err := e.Run(w.ctx, acme, w.checkout(), order)
	require.NoError(t, err)
	require.Equal(t, map[string]time.Duration{
		"create_order": time.Minute, "charge": time.Minute, "record_charge": time.Minute,
	}, obs.took)
}

// stepTimes is an Observer that keeps each step's duration.
type stepTimes struct {
	mu   sync.Mutex
	took map[string]time.Duration
}

func (s *stepTimes) Claimed(string, string) {}
func (s *stepTimes) LeaseLost(string)       {}
func (s *stepTimes) StepFinished(_, step string, took time.Duration, _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.took == nil {
		s.took = map[string]time.Duration{}
	}
	s.took[step] = took
}
