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

// The clock tests run the engine against a database whose clock is an hour
// ahead of the machine's, or an hour behind (dbtest.NewSkewedDatabase),
// and give the engines' Config.Clock other offsets still, or make it jump:
// a lease computed or judged by any clock but the database's, in one
// statement, is an hour wrong there. Each asserts that claims, takeovers,
// Retry-After, renewals and replays behave as with no skew.

// dbSkews are how far the database's clock is off the machine's.
var dbSkews = []time.Duration{time.Hour, -time.Hour}

func dbSkewName(skew time.Duration) string {
	if skew < 0 {
		return fmt.Sprintf("database %s behind", -skew)
	}
	return fmt.Sprintf("database %s ahead", skew)
}

// dbNow reads the database's clock.
func (w *world) dbNow() time.Time {
	w.t.Helper()
	var now time.Time
	require.NoError(w.t, w.db.QueryRow(w.ctx, `SELECT clock_timestamp()`).Scan(&now))
	return now
}

// requireLeaseFromDBClock checks that the lease on key ends at most lease
// after the database's now, and more than half of it: a lease computed from
// the process's clock would end an hour early or an hour late.
func (w *world) requireLeaseFromDBClock(key workflow.Key, lease time.Duration, what string) {
	w.t.Helper()
	store, err := recovery.New(w.db, recovery.Config{})
	require.NoError(w.t, err)
	rec, err := store.Load(w.ctx, key)
	require.NoError(w.t, err)
	left := rec.LockedUntil.Sub(w.dbNow())
	require.LessOrEqual(w.t, left, lease, "%s: the lease ends a lease from the database's now, not an hour away", what)
	require.Greater(w.t, left, lease/2, "%s: the lease ends a lease from the database's now, not an hour ago", what)
}

// TestSkewedClockDoesNotTakeOverAValidLease: a client finds a key held by a
// live attempt in flight, with a Retry-After that is the lease's remaining
// time by the database clock, and the holder keeps the key. The database's
// clock is an hour off the machine's; the holder's Config.Clock is an hour
// off the other way, the client's is the machine's. A lease computed or
// judged by a local clock would be an hour expired (taken over) or an hour
// long (Retry-After of an hour). The holder waits in its first step, a
// foreign call, where its lease is the claim's own, or in the checkout's
// charge, where it is the one the first phase's commit set.
func TestSkewedClockDoesNotTakeOverAValidLease(t *testing.T) {
	t.Parallel()
	for _, skew := range dbSkews {
		for _, held := range []string{"claim", "first phase's commit"} {
			t.Run(dbSkewName(skew)+", lease from the "+held, func(t *testing.T) {
				w := newSkewedWorld(t, skew)
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
				if held == "claim" {
					wf = workflow.Define("charge_first", foreign.Mutation("charge",
						func(ctx context.Context, c *foreign.Call[Order, Paid]) error { return w.step(ctx, c.Step) }))
				}
				holder := w.engine(workflow.Config{Lease: lease, Clock: newSkewedClock(-skew).Now})
				client := w.engine(workflow.Config{Lease: lease})
				done := make(chan error, 1)
				go func() {
					_, err := wf.Run(w.ctx, holder, acme, order)
					done <- err
				}()
				<-entered
				w.requireLeaseFromDBClock(acme, lease, "the holder's")
				heldRec, err := client.Store().Load(w.ctx, acme)
				require.NoError(t, err)

				_, err = wf.Run(w.ctx, client, acme, order)
				require.ErrorIs(t, err, workflow.ErrInFlight, "a valid lease is not taken over")
				var inFlight *recovery.InFlightError
				require.ErrorAs(t, err, &inFlight)
				require.LessOrEqual(t, inFlight.RetryAfter, lease, "Retry-After is what is left of the lease, not an hour")
				require.Greater(t, inFlight.RetryAfter, lease/2, "Retry-After is what is left of the lease, not the minimum")
				_, err = client.Resume(w.ctx, acme)
				require.ErrorIs(t, err, workflow.ErrInFlight, "a sweeper does not take it over either")

				now, err := client.Store().Load(w.ctx, acme)
				require.NoError(t, err)
				require.Equal(t, heldRec.Owner, now.Owner, "the holder keeps the key")
				require.Zero(t, now.Attempts)

				close(release)
				require.NoError(t, <-done)
				res, err := wf.Run(w.ctx, client, acme, order)
				require.NoError(t, err)
				require.True(t, res.Replayed)
			})
		}
	}
}

// TestSkewedClockTakesOverAnExpiredLease: once the lease of a crashed
// attempt has expired by the database clock, a client takes the key over
// and finishes it once, under a new lease that ends by the database clock;
// until then it gets ErrInFlight. A released lease (a failed attempt) is
// taken over at once, by a sweeper's Resume too. The database's clock is an
// hour off the machine's, the failing attempts' Config.Clock an hour off
// the other way.
func TestSkewedClockTakesOverAnExpiredLease(t *testing.T) {
	t.Parallel()
	for _, skew := range dbSkews {
		t.Run(dbSkewName(skew), func(t *testing.T) {
			w := newSkewedWorld(t, skew)
			wf := w.checkout()
			crashing := w.engine(workflow.Config{Clock: newSkewedClock(-skew).Now,
				Hooks: crashAt(workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"})})
			_, err := wf.Run(w.ctx, crashing, acme, order)
			require.ErrorIs(t, err, workflow.ErrCrashed)

			// The takeover's lease, seen from the step it runs first.
			leaseChecked := 0
			client := w.engine(workflow.Config{Hooks: &workflow.Hooks{
				CrashPoint: func(_ context.Context, key workflow.Key, p workflow.CrashPoint) error {
					if p == (workflow.CrashPoint{Kind: workflow.BeforeStep, Step: "charge"}) {
						w.requireLeaseFromDBClock(key, recovery.LeaseDefault, "the takeover's")
						leaseChecked++
					}
					return nil
				}}})
			_, err = wf.Run(w.ctx, client, acme, order)
			require.ErrorIs(t, err, workflow.ErrInFlight, "the crashed attempt's lease still holds")
			var inFlight *recovery.InFlightError
			require.ErrorAs(t, err, &inFlight)
			require.LessOrEqual(t, inFlight.RetryAfter, recovery.LeaseDefault, "Retry-After is what is left of the lease, not an hour")
			require.Greater(t, inFlight.RetryAfter, recovery.LeaseDefault/2, "Retry-After is what is left of the lease, not the minimum")
			require.NoError(t, client.Store().ExpireLease(w.ctx, acme))
			res, err := wf.Run(w.ctx, client, acme, order)
			require.NoError(t, err)
			require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
			require.Equal(t, "create_order", res.ResumedFrom)
			require.Equal(t, 201, res.Response.Status)
			require.Equal(t, 1, leaseChecked)
			require.Equal(t, 1, w.orders())
			require.Equal(t, 1, w.provider.Effects("charges"))

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
			_, err = wf.Run(w.ctx, w.engine(workflow.Config{Clock: newSkewedClock(-skew).Now}), other, order)
			require.ErrorContains(t, err, "provider down")
			res, err = client.Resume(w.ctx, other)
			require.NoError(t, err)
			require.Equal(t, recovery.OutcomeTakeover, res.Outcome)
			require.Equal(t, 2, leaseChecked)
			require.Equal(t, 2, w.orders())
		})
	}
}

// TestSkewedClockReplaysFinishedRecords: a record finished under one clock
// replays, verbatim, to clients whose clocks are an hour ahead and behind,
// from a database whose clock is off as well.
func TestSkewedClockReplaysFinishedRecords(t *testing.T) {
	t.Parallel()
	for _, skew := range dbSkews {
		t.Run(dbSkewName(skew), func(t *testing.T) {
			w := newSkewedWorld(t, skew)
			wf := w.checkout()
			first, err := wf.Run(w.ctx, w.engine(workflow.Config{Clock: newSkewedClock(-skew).Now}), acme, order)
			require.NoError(t, err)
			for _, clock := range []time.Duration{-time.Hour, 0, time.Hour} {
				res, err := wf.Run(w.ctx, w.engine(workflow.Config{Clock: newSkewedClock(clock).Now}), acme, order)
				require.NoError(t, err)
				require.True(t, res.Replayed, "process clock %s", clock)
				require.Equal(t, first.Response, res.Response)
			}
			require.Equal(t, 1, w.orders())
			require.Equal(t, 1, w.provider.Effects("charges"))
		})
	}
}

// TestHeartbeatRenewsUnderSkewedClock: with the database's clock an hour off
// the machine's, and the process's Config.Clock an hour off the other way
// or jumping an hour mid-step, the heartbeat renews a long step's lease, the
// step is not cancelled, and each renewal's end is by the database clock. A
// heartbeat that timed its renewals from the lease's end by a local clock
// would renew an hour late, or never; one that measured "a whole lease"
// with Config.Clock would cancel the step when that clock jumps ahead.
func TestHeartbeatRenewsUnderSkewedClock(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name         string
		db           time.Duration
		offset, jump time.Duration // of Config.Clock; jump: at the first renewal
	}{
		{"database ahead, process behind", time.Hour, -time.Hour, 0},
		{"database behind, process ahead", -time.Hour, time.Hour, 0},
		{"database ahead, process jumps ahead", time.Hour, 0, time.Hour},
		{"database behind, process jumps back", -time.Hour, 0, -time.Hour},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newSkewedWorld(t, tc.db)
			// Long enough that two renewals a third of it apart come in time on
			// a loaded machine; the test lasts about two thirds of it.
			const lease = 2 * time.Second
			clock := newSkewedClock(tc.offset)
			renewed := make(chan time.Time, 16)
			hooks := &workflow.Hooks{LeaseRenewed: func(_ workflow.Key, step string, until time.Time, err error) {
				if err == nil && step == "slow" {
					renewed <- until
				}
			}}
			wf := workflow.Define("slow", foreign.Mutation("slow", func(ctx context.Context, _ *foreign.Call[Order, Paid]) error {
				return awaitRenewals(ctx, renewed, 2, tc.db, lease, func() { clock.jump(tc.jump) })
			}))
			e := w.engine(workflow.Config{Lease: lease, Hooks: hooks, Clock: clock.Now})
			res, err := wf.Run(w.ctx, e, acme, order)
			require.NoError(t, err, "the step was not cancelled")
			require.Equal(t, 200, res.Response.Status)
		})
	}
}

// awaitRenewals waits until n renewals arrived on renewed, calling onFirst
// after the first, and checks that each moved the lease and ended it by the
// database clock, which is dbSkew off the machine's: at most a lease after
// its now, and not more than a lease before (a renewal told late, on a
// loaded machine). A lease computed from a local clock would be an hour
// off.
func awaitRenewals(ctx context.Context, renewed <-chan time.Time, n int, dbSkew, lease time.Duration, onFirst func()) error {
	var seen []time.Time
	for len(seen) < n {
		select {
		case until := <-renewed:
			if left := until.Sub(time.Now().Add(dbSkew)); left > lease || left < -lease {
				return fmt.Errorf("the lease ends %s from the database's now: not by the database clock", left)
			}
			if len(seen) > 0 && !until.After(seen[len(seen)-1]) {
				return errors.New("a renewal did not move the lease")
			}
			seen = append(seen, until)
			if len(seen) == 1 {
				onFirst()
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
// without a renewal, long before its caller gives up. A heartbeat that
// measured that lease with the local clock, or from the lease's end (by the
// database clock, an hour ahead of the machine's in one case) with the
// local clock, would keep the step running for an hour, while another
// attempt takes the key over and runs the same step.
func TestClockJumpingBackDoesNotKeepAStepPastItsLease(t *testing.T) {
	t.Parallel()
	for _, skew := range dbSkews {
		t.Run(dbSkewName(skew), func(t *testing.T) {
			w := newSkewedWorld(t, skew)
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
			const lease = 900 * time.Millisecond
			e, err := workflow.NewEngine(db, workflow.Config{Lease: lease, Clock: clock.Now, Hooks: hooks})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(w.ctx, 30*lease)
			defer cancel()
			_, err = wf.Run(ctx, e, acme, order)
			require.True(t, jumped.Load(), "the clock jumped while renewals failed")
			require.NoError(t, ctx.Err(), "the step ran until its caller gave up")
			require.ErrorIs(t, err, workflow.ErrLeaseLost)
			require.ErrorContains(t, err, "connection refused", "the renewals' error is kept")
		})
	}
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
	_, err = wf.Run(ctx, e, acme, order)
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
	_, err := w.checkout().Run(w.ctx, e, acme, order)
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

func (s *stepTimes) Claimed(string, string)            {}
func (s *stepTimes) LeaseLost(string)                  {}
func (s *stepTimes) StepRetried(string, string)        {}
func (*stepTimes) PaceWaited(string, time.Duration)    {}
func (*stepTimes) PaceDeferred(string)                 {}
func (*stepTimes) CircuitOpened(string, time.Duration) {}
func (s *stepTimes) Parked(string)                     {}
func (s *stepTimes) StepFinished(_, step string, took time.Duration, _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.took == nil {
		s.took = map[string]time.Duration{}
	}
	s.took[step] = took
}
