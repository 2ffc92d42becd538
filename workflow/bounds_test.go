package workflow_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// TestDuplicateDoesNotWaitForTheFirstPhase: while a request's first atomic
// phase runs (its claim uncommitted, holding the key's row), a duplicate is
// answered "in flight" at once, waiting on no lock and holding no
// connection for the phase's length. The first phase here waits until the duplicate has its answer, so
// a duplicate that waited for the phase would never get one: it would run
// into its own deadline instead.
//
// Before migration 0006, the duplicate waited on the row lock for the whole
// phase; from 0006 to 0017 it waited on it for 10 ms (lock_timeout); since
// 0017 it waits on no lock at all.
func TestDuplicateDoesNotWaitForTheFirstPhase(t *testing.T) {
	w := newWorld(t)
	entered, answered := make(chan struct{}), make(chan struct{})
	wf := workflow.Define("slow_first_phase",
		phase.Atomic("slow", func(ctx context.Context, tx pgx.Tx, _ *phase.Run[Order, Paid]) error {
			close(entered)
			select {
			case <-answered:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}))
	e := w.engine(workflow.Config{})
	first := make(chan error, 1)
	go func() {
		_, err := wf.Run(w.ctx, e, acme, order)
		first <- err
	}()
	<-entered
	ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
	defer cancel()
	var err error
	waits := dbtest.LockWaits(t, w.db, func() { _, err = wf.Run(ctx, e, acme, order) })
	close(answered)
	var inFlight *recovery.InFlightError
	require.ErrorAs(t, err, &inFlight, "the duplicate is told the key is in flight")
	require.Positive(t, inFlight.RetryAfter)
	require.Zero(t, waits, "the duplicate waited on a lock (migration 0017's key lock answers it without one)")
	require.NoError(t, <-first)
}

// TestFrozenFirstPhaseFreesItsKeyAfterIdleTimeout: a process that stops
// talking to the database in its first atomic phase (frozen, or cut off
// by a partition or a lost host) holds the key only through its open
// transaction. Duplicates are told "in flight" at once, and once the
// transaction has waited on its application for Config.IdleTimeout the
// server ends it (the claim's idle_in_transaction_session_timeout): the
// key is free, a retry runs the workflow, and when the frozen phase wakes,
// its commit fails. One order in the end, the retry's.
func TestFrozenFirstPhaseFreesItsKeyAfterIdleTimeout(t *testing.T) {
	w := newWorld(t)
	const idle = 500 * time.Millisecond
	entered, wake := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	wf := workflow.Define("frozen_first_phase",
		phase.Atomic("create", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders (tenant, key, customer, amount, status)
				VALUES ($1, $2, $3, $4, 'new')`, r.Key.Tenant, r.Key.ID, r.Request.Customer, r.Request.Amount); err != nil {
				return err
			}
			if calls.Add(1) == 1 {
				close(entered)
				<-wake // frozen: deaf to its context, as a stopped process is
			}
			return nil
		}))
	e := w.engine(workflow.Config{IdleTimeout: idle})
	retrying := w.engine(workflow.Config{}) // its own claims are not cut short on a loaded machine
	first := make(chan error, 1)
	go func() {
		_, err := wf.Run(w.ctx, e, acme, order)
		first <- err
	}()
	defer close(wake)
	<-entered

	var inFlight *recovery.InFlightError
	_, err := wf.Run(w.ctx, retrying, acme, order)
	require.ErrorAs(t, err, &inFlight, "the frozen transaction holds the key")

	res, err := untilKeyFree(idle, func() (*workflow.Result, error) { return wf.Run(w.ctx, retrying, acme, order) })
	require.NoError(t, err, "the frozen transaction still holds the key after %s", 60*idle)
	require.False(t, res.Replayed)
	require.EqualValues(t, 2, calls.Load())

	wake <- struct{}{}
	require.Error(t, <-first, "the frozen phase's transaction was ended: its commit fails")
	require.Equal(t, 1, w.orders(), "the frozen phase's order rolled back, the retry's committed")
	var status string
	require.NoError(t, w.db.QueryRow(w.ctx, `SELECT status FROM onceflow_keys WHERE tenant_id = $1 AND key = $2`,
		acme.Tenant, acme.ID).Scan(&status))
	require.Equal(t, "completed", status)
}

// TestFrozenResumeFreesItsKeyAfterIdleTimeout: the same for a resume (a
// sweeper's completer, Engine.Resume) whose next step is atomic, so its
// takeover is made in that step's transaction: a completer frozen in it
// holds the key only until the server ends the transaction, IdleTimeout
// later, and another resume finishes the workflow, once.
func TestFrozenResumeFreesItsKeyAfterIdleTimeout(t *testing.T) {
	w := newWorld(t)
	const idle = 500 * time.Millisecond
	entered, wake := make(chan struct{}), make(chan struct{})
	var finishes atomic.Int32
	wf := workflow.Define("frozen_resume",
		phase.Atomic("create", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			return tx.QueryRow(ctx, `INSERT INTO orders (tenant, key, customer, amount, status)
				VALUES ($1, $2, $3, $4, 'new') RETURNING id`, r.Key.Tenant, r.Key.ID, r.Request.Customer, r.Request.Amount).Scan(&r.State.OrderID)
		}),
		phase.Atomic("finish", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			switch finishes.Add(1) {
			case 1:
				return errors.New("the first attempt stops after create")
			case 2:
				if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'frozen' WHERE id = $1`, r.State.OrderID); err != nil {
					return err
				}
				close(entered)
				<-wake // frozen: deaf to its context, as a stopped process is
			}
			_, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, r.State.OrderID)
			return err
		}))
	e := w.engine(workflow.Config{IdleTimeout: idle, Workflows: []workflow.Definition{wf}})
	retrying := w.engine(workflow.Config{Workflows: []workflow.Definition{wf}})
	_, err := wf.Run(w.ctx, e, acme, order)
	require.Error(t, err)
	require.NoError(t, e.Store().ExpireLease(w.ctx, acme))

	first := make(chan error, 1)
	go func() {
		_, err := e.Resume(w.ctx, acme)
		first <- err
	}()
	defer close(wake)
	<-entered

	res, err := untilKeyFree(idle, func() (*workflow.Result, error) { return retrying.Resume(w.ctx, acme) })
	require.NoError(t, err, "the frozen resume's transaction still holds the key after %s", 60*idle)
	require.False(t, res.Replayed)
	require.EqualValues(t, 3, finishes.Load())

	wake <- struct{}{}
	require.Error(t, <-first, "the frozen resume's transaction was ended: its commit fails")
	require.Equal(t, 1, w.orders())
	require.Equal(t, 1, w.count(`SELECT count(*) FROM orders WHERE status = 'paid'`), "the frozen update rolled back")
}

// TestSlowFirstPhaseOutlivesItsLease: a live first phase that pauses
// between its statements for longer than the lease (but within
// IdleTimeout) keeps its key and commits: the lease does not bound a
// transaction that holds the key by being open.
func TestSlowFirstPhaseOutlivesItsLease(t *testing.T) {
	w := newWorld(t)
	const lease = 200 * time.Millisecond
	var calls atomic.Int32
	wf := workflow.Define("slow_first_phase_lease",
		phase.Atomic("create", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			calls.Add(1)
			if _, err := tx.Exec(ctx, `INSERT INTO orders (tenant, key, customer, amount, status)
				VALUES ($1, $2, $3, $4, 'new')`, r.Key.Tenant, r.Key.ID, r.Request.Customer, r.Request.Amount); err != nil {
				return err
			}
			time.Sleep(3 * lease)
			_, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE key = $1`, r.Key.ID)
			return err
		}))
	res, err := wf.Run(w.ctx, w.engine(workflow.Config{Lease: lease, MaxAttempts: 1}), acme, order)
	require.NoError(t, err)
	require.False(t, res.Failed)
	require.EqualValues(t, 1, calls.Load())
	require.Equal(t, 1, w.count(`SELECT count(*) FROM orders WHERE status = 'paid'`))
}

// TestWokenFirstPhaseLeavesTheRetryAlone: a first phase whose transaction
// the server ended (IdleTimeout) wakes while a retry holds the key and
// runs. Its commit, which carried the record's insert, fails; what it
// writes next is a fenced update, which finds no record, so it writes
// nothing: with MaxAttempts 1 it used to insert a failed record outside
// the key lock, and the retry's commit then failed on it, leaving a
// stored 500 and no order.
func TestWokenFirstPhaseLeavesTheRetryAlone(t *testing.T) {
	w := newWorld(t)
	const idle = 300 * time.Millisecond
	p1In, p1Wake := make(chan struct{}), make(chan struct{})
	p2In, p2Go := make(chan struct{}), make(chan struct{})
	var wakeP1, letP2Go sync.Once
	t.Cleanup(func() { // a failed test lets the phases end before the pool closes
		wakeP1.Do(func() { close(p1Wake) })
		letP2Go.Do(func() { close(p2Go) })
	})
	var calls atomic.Int32
	wf := workflow.Define("woken_first_phase",
		phase.Atomic("create", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			n := calls.Add(1)
			if _, err := tx.Exec(ctx, `INSERT INTO orders (tenant, key, customer, amount, status)
				VALUES ($1, $2, $3, $4, 'paid')`, r.Key.Tenant, r.Key.ID, r.Request.Customer, r.Request.Amount); err != nil {
				return err
			}
			switch n {
			case 1:
				close(p1In)
				<-p1Wake
			case 2:
				close(p2In)
				<-p2Go
			}
			return nil
		}))
	e := w.engine(workflow.Config{IdleTimeout: idle, MaxAttempts: 1})
	// The retry waits in its phase for the first attempt to wake: its
	// engine keeps the default IdleTimeout.
	retrying := w.engine(workflow.Config{MaxAttempts: 1})
	first, second := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := wf.Run(w.ctx, e, acme, order)
		first <- err
	}()
	<-p1In
	// The retry runs once the server has ended the first transaction.
	go func() {
		_, err := untilKeyFree(idle, func() (*workflow.Result, error) { return wf.Run(w.ctx, retrying, acme, order) })
		second <- err
	}()
	select {
	case <-p2In:
	case err := <-second:
		require.FailNow(t, "the retry never got the key", "%v", err)
	}
	wakeP1.Do(func() { close(p1Wake) })
	_ = within(t, first, 60*idle) // its commit failed; what it answers is the next lines' concern
	letP2Go.Do(func() { close(p2Go) })
	require.NoError(t, within(t, second, 60*idle))

	res, err := wf.Run(w.ctx, retrying, acme, order)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.False(t, res.Failed, "the retry's answer is stored, not the woken attempt's failure: %s", res.Response.Body)
	require.Equal(t, 1, w.orders())
}

// TestRefusedFirstCommitCountsAnAttempt: a first phase whose commit the
// server refuses (a deferred constraint checked at COMMIT) committed
// nothing, in a session that goes on: its attempt is counted like a
// phase's error, and the MaxAttempts-th is stored as a 500, not answered
// "lease lost" (409) for ever as if another attempt held the key. The
// refusal of a deferred unique constraint of the phase's own is its error
// too, not a lost key.
func TestRefusedFirstCommitCountsAnAttempt(t *testing.T) {
	w := newWorld(t)
	_, err := w.db.Exec(w.ctx, `CREATE TABLE parents (id int PRIMARY KEY);
		CREATE TABLE children (parent int REFERENCES parents DEFERRABLE INITIALLY DEFERRED);
		CREATE TABLE singles (v int, UNIQUE (v) DEFERRABLE INITIALLY DEFERRED);
		INSERT INTO singles VALUES (1)`)
	require.NoError(t, err)
	for _, c := range []struct{ name, insert string }{
		{"foreign key", `INSERT INTO children VALUES (1)`},
		{"unique", `INSERT INTO singles VALUES (1)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			wf := workflow.Define("refused_"+strings.ReplaceAll(c.name, " ", "_"),
				phase.Atomic("create", func(ctx context.Context, tx pgx.Tx, _ *phase.Run[Order, Paid]) error {
					_, err := tx.Exec(ctx, c.insert)
					return err
				}),
				phase.Atomic("next", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil }))
			e := w.engine(workflow.Config{MaxAttempts: 2})
			key := workflow.Key{Tenant: "acme", ID: c.name}
			_, err := wf.Run(w.ctx, e, key, order)
			require.Error(t, err)
			require.NotErrorIs(t, err, workflow.ErrLeaseLost)
			rec, err := e.Store().Load(w.ctx, key)
			require.NoError(t, err, "the refused attempt is recorded")
			require.Equal(t, 1, rec.Attempts)
			res, err := wf.Run(w.ctx, e, key, order)
			require.NoError(t, err)
			require.True(t, res.Failed, "the second refusal spends MaxAttempts")
			require.Equal(t, 500, res.Response.Status)
			res, err = wf.Run(w.ctx, e, key, order)
			require.NoError(t, err)
			require.True(t, res.Replayed && res.Failed)
		})
	}
}

// untilKeyFree runs run again while it answers "in flight", as a client
// would, for up to 60 times idle: many server timeouts, so that only a key
// held for good fails the caller's test. It returns run's last answer.
func untilKeyFree(idle time.Duration, run func() (*workflow.Result, error)) (*workflow.Result, error) {
	deadline := time.Now().Add(60 * idle)
	for {
		res, err := run()
		var inFlight *recovery.InFlightError
		if !errors.As(err, &inFlight) || time.Now().After(deadline) {
			return res, err
		}
		time.Sleep(idle / 10)
	}
}

// within returns what ch gives within d, and fails the test past it.
func within[T any](t *testing.T, ch <-chan T, d time.Duration) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		require.FailNow(t, "no answer", "within %s", d)
		panic("unreachable")
	}
}

// TestDBTimeoutBoundsTheClaim: a database that does not answer (its key
// table locked by another session, or a pool with no connection to give)
// makes Run return ErrUnavailable within Config.DBTimeout, running
// nothing, instead of hanging.
func TestDBTimeoutBoundsTheClaim(t *testing.T) {
	w := newWorld(t)
	var ran atomic.Int32
	wf := workflow.Define("count",
		phase.Atomic("count", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error {
			ran.Add(1)
			return nil
		}))
	// The bound under test is short; the caller's own deadline is long, so
	// that a hang shows as a test failure, not as a pass.
	const bound = 300 * time.Millisecond
	engine := func(db workflow.DB) *workflow.Engine {
		e, err := workflow.NewEngine(db, workflow.Config{DBTimeout: bound, Workflows: []workflow.Definition{wf}})
		require.NoError(t, err)
		// Stored while the database answers: a run that comes before its
		// definition is stored waits for that, bounded by its own context,
		// not by DBTimeout, which bounds the claim.
		require.NoError(t, e.SaveDefinitions(w.ctx))
		return e
	}
	run := func(e *workflow.Engine) error {
		ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
		defer cancel()
		_, err := wf.Run(ctx, e, acme, order)
		return err
	}

	t.Run("locked table", func(t *testing.T) {
		e := engine(w.db)
		locker, err := w.db.Begin(w.ctx)
		require.NoError(t, err)
		defer func() { _ = locker.Rollback(w.ctx) }()
		_, err = locker.Exec(w.ctx, `LOCK TABLE onceflow_keys IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)
		err = run(e)
		require.ErrorIs(t, err, workflow.ErrUnavailable)
		require.False(t, errors.Is(err, workflow.ErrInFlight), "a locked table is not a key in flight")
	})

	t.Run("full pool", func(t *testing.T) {
		cfg := w.db.Config()
		cfg.MaxConns = 1
		small, err := pgxpool.NewWithConfig(w.ctx, cfg)
		require.NoError(t, err)
		defer small.Close()
		e := engine(small)
		held, err := small.Acquire(w.ctx)
		require.NoError(t, err)
		defer held.Release()
		require.ErrorIs(t, run(e), workflow.ErrUnavailable)
	})

	require.Zero(t, ran.Load(), "nothing ran")
	require.Zero(t, w.keys(), "nothing was written")
}
