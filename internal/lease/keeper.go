// Package lease keeps a key's lease while its holder works: the one place
// that decides when to renew a lease and when its holder must stop.
//
// One rule, for every holder (a workflow attempt, the HTTP middleware): the
// lease is known to last until the send time of the last write that
// extended it (the claim, a commit, a renewal) plus the lease. The keeper
// renews it a third of the lease after that time, and again every third
// after a failed renewal; when no extension succeeded for nine tenths of a
// lease, it cancels the holder's work, a little before the database could
// let another attempt take the key over. Time is measured with the
// runtime's monotonic clock, never a clock a test or an operator can move,
// and the measure spans the whole attempt: a new step does not restart it.
package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/recovery"
)

// RenewFunc extends the lease in the database, fenced by the holder's owner
// token, and returns its new end by the database clock. It returns an error
// matching recovery.ErrLeaseLost when the key was taken over.
type RenewFunc func(ctx context.Context) (until time.Time, err error)

// Pool gives out connections; *pgxpool.Pool satisfies it.
type Pool interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Send runs fn on a connection taken from pool and returns when fn's
// statement was sent: after the connection was acquired, so that a wait for
// a busy pool is not counted as lease time already spent.
func Send(ctx context.Context, pool Pool, fn func(conn *pgxpool.Conn) error) (time.Time, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return time.Time{}, err
	}
	defer conn.Release()
	sent := time.Now()
	return sent, fn(conn)
}

// Keeper holds one attempt's lease.
type Keeper struct {
	lease time.Duration
	renew RenewFunc
	// OnRenew, if set, is called after each renewal with its result.
	onRenew func(until time.Time, err error)

	mu       sync.Mutex
	extended time.Time // when the last successful extension was sent
	lastErr  error     // the last failed renewal's error, kept for the report
}

// New returns a keeper for a lease of the given length whose last
// extension (normally the claim) was sent at sent. onRenew, if not nil, is
// told of every renewal.
func New(lease time.Duration, sent time.Time, renew RenewFunc, onRenew func(until time.Time, err error)) *Keeper {
	return &Keeper{lease: lease, renew: renew, onRenew: onRenew, extended: sent}
}

// Extended records that a write extending the lease, sent at sent, succeeded.
func (k *Keeper) Extended(sent time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if sent.After(k.extended) {
		k.extended = sent
		k.lastErr = nil
	}
}

// safeFor is how long after an extension was sent the holder may go on
// working: nine tenths of the lease, so that a timer that fires a little
// late still stops the work before the lease ends by the database clock.
func (k *Keeper) safeFor() time.Duration { return k.lease - k.lease/10 }

// untilExpiry returns how long the holder may still work.
func (k *Keeper) untilExpiry() time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	return time.Until(k.extended.Add(k.safeFor()))
}

// Expired reports whether the holder must stop: no extension succeeded for
// nine tenths of a lease.
func (k *Keeper) Expired() bool { return k.untilExpiry() <= 0 }

// untilRenewal returns how long until the next renewal is due: a third of
// the lease after the last extension.
func (k *Keeper) untilRenewal() time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	return time.Until(k.extended.Add(k.lease / 3))
}

// expiredError says why the holder was stopped.
func (k *Keeper) expiredError() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	err := fmt.Errorf("%w: no renewal succeeded for a whole lease (%s)", recovery.ErrLeaseLost, k.lease)
	if k.lastErr != nil {
		err = fmt.Errorf("%w: %w", err, k.lastErr)
	}
	return err
}

// LostError is the cause of a held context's cancellation when the lease
// was lost or may have ended. It matches recovery.ErrLeaseLost.
type LostError struct{ Err error }

func (e *LostError) Error() string { return e.Err.Error() }
func (e *LostError) Unwrap() error { return e.Err }

// Hold runs renewals while the holder works. It returns a context for the
// work, cancelled with a *LostError when a renewal finds the key taken
// over or when the lease may have ended, and a stop function that ends the
// renewals, waits for them and returns that *LostError, if any. A lease
// that ended before Hold was called gives a context that is already
// cancelled. Renewals go on after such a cancellation until stop (or until
// the key is found taken over): work that does not heed its context at once
// keeps the key while the fence still holds.
func (k *Keeper) Hold(ctx context.Context) (context.Context, func() error) {
	held, cancel := context.WithCancelCause(ctx)
	expire := func() { cancel(&LostError{k.expiredError()}) }
	deadline := time.AfterFunc(k.untilExpiry(), expire)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer deadline.Stop()
		k.renewUntil(ctx, done, deadline, cancel)
	})
	return held, func() error {
		// Cancel first: a renewal waiting for a connection the work holds
		// must not keep the work from finishing.
		close(done)
		cancel(nil)
		wg.Wait()
		var lost *LostError
		if errors.As(context.Cause(held), &lost) {
			return lost
		}
		return nil
	}
}

// renewUntil renews the lease when due until done is closed or ctx (the
// holder's own, not the held one) ends, moving deadline after each
// success. The deadline fires even while a renewal hangs.
func (k *Keeper) renewUntil(ctx context.Context, done <-chan struct{}, deadline *time.Timer, cancel context.CancelCauseFunc) {
	wait := time.NewTimer(max(k.untilRenewal(), 0))
	defer wait.Stop()
	renewCtx, stopRenewal := context.WithCancel(ctx)
	defer stopRenewal()
	go func() {
		select {
		case <-done: // stop ends a renewal in flight
			stopRenewal()
		case <-renewCtx.Done():
		}
	}()
	for {
		select {
		case <-renewCtx.Done():
			return
		case <-wait.C:
		}
		sent := time.Now()
		until, err := k.renew(renewCtx)
		if renewCtx.Err() != nil {
			return // stopped mid-renewal: nothing to report
		}
		if k.onRenew != nil {
			k.onRenew(until, err)
		}
		switch {
		case err == nil:
			k.Extended(sent)
			deadline.Reset(k.untilExpiry())
		case errors.Is(err, recovery.ErrLeaseLost):
			cancel(&LostError{err})
			return
		default:
			k.mu.Lock()
			k.lastErr = err
			k.mu.Unlock()
		}
		wait.Reset(max(k.untilRenewal(), k.lease/3))
	}
}
