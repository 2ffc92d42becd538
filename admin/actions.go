package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// Action is what an operator presents to act on one record.
type Action struct {
	// Owner is the owner token the operator read (Record.Owner): the
	// action is refused with ErrChanged if the record changed hands since.
	// Required.
	Owner uuid.UUID `json:"owner"`
	// Force acts on a record whose lease is still valid, fencing out a
	// holder that may be at work. Without it such a record is refused
	// with a *LiveLeaseError, checked by the statement that writes, so
	// that a holder renewing its lease meanwhile keeps the record.
	Force bool `json:"force,omitempty"`
	// Reason says why; it is kept as the record's last error.
	Reason string `json:"reason,omitempty"`
}

// reason is the cause an action keeps as the record's last error.
func (act Action) reason(verb string) string {
	r := act.Reason
	if r == "" {
		r = "no reason given"
	}
	return verb + " by an operator: " + r
}

// failedResponse is what a record failed by an operator answers its
// retries.
var failedResponse = workflow.Problem(http.StatusInternalServerError, "the operation was stopped and will not be retried")

// Release ends the lease of a record in flight, or parked, as if its
// holder had failed: it stays at its recovery point, its attempts grow by
// one, and the next claim or the completer takes it over at once. A
// deferred record is released from its deferral; a parked one goes back in
// flight, and is parked again unless a definition the running processes
// register may resume it. It returns the record as it is afterwards.
func (a *Admin) Release(ctx context.Context, key recovery.Key, act Action) (*Record, error) {
	return a.act(ctx, "release", key, act, func(f recovery.Fence, forced bool) error {
		if forced {
			return a.ops.ForceRelease(ctx, f, act.reason("released"))
		}
		return a.ops.ReleaseLeaseOver(ctx, f, act.reason("released"))
	})
}

// Fail ends a record in flight, or parked, for good: its retries get a
// stored 500 and nothing runs again. Steps that already committed stay
// committed: Fail undoes nothing. It returns the record as it is
// afterwards.
func (a *Admin) Fail(ctx context.Context, key recovery.Key, act Action) (*Record, error) {
	return a.act(ctx, "fail", key, act, func(f recovery.Fence, forced bool) error {
		if forced {
			return a.ops.ForceFail(ctx, f, failedResponse, act.reason("failed"))
		}
		return a.ops.FailLeaseOver(ctx, f, failedResponse, act.reason("failed"))
	})
}

// ResumeNow releases the record as Release does (an attempt counts) and,
// when Config.Engine registers its workflow, runs its work at once in this
// process with Engine.Resume, from its recovery point; otherwise the next
// retry or the completer does. The run's own failure is not ResumeNow's
// error: the record returned, as it is afterwards, shows it (LastError),
// as after any attempt, and so does another process taking the record
// first.
func (a *Admin) ResumeNow(ctx context.Context, key recovery.Key, act Action) (*Record, error) {
	rec, err := a.act(ctx, "resume", key, act, func(f recovery.Fence, forced bool) error {
		if forced {
			return a.ops.ForceRelease(ctx, f, act.reason("resumed"))
		}
		return a.ops.ReleaseLeaseOver(ctx, f, act.reason("resumed"))
	})
	if err != nil {
		return nil, err
	}
	if a.engine != nil && slices.Contains(a.engine.Workflows(), rec.Workflow) {
		if _, err := a.engine.Resume(ctx, key); err != nil {
			a.logger.WarnContext(ctx, "admin: resume ran and failed", "tenant", key.Tenant, "key", key.ID, "error", err)
		}
	}
	return a.load(ctx, key)
}

// act loads key, checks the operator's owner token and applies write,
// fenced by that token (not by the one loaded here: the statement that
// writes is the check). write's forced is true when the action is forced on a
// record in flight: it may then write whatever the lease; otherwise it
// writes only if the lease is over (or the record parked), checked in its
// statement. A write that matches nothing is explained by loading the
// record again.
func (a *Admin) act(ctx context.Context, verb string, key recovery.Key, act Action,
	write func(f recovery.Fence, forced bool) error) (*Record, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	if act.Owner == uuid.Nil {
		return nil, fmt.Errorf("%w: %s needs the owner token read with the record", ErrInvalidInput, verb)
	}
	rec, err := a.store.Load(ctx, key)
	if err != nil {
		return nil, err
	}
	if err := refuse(rec, act.Owner); err != nil {
		return nil, err
	}
	err = write(recovery.Fence{Key: key, Owner: act.Owner}, act.Force && rec.Status == recovery.StatusInFlight)
	if errors.Is(err, recovery.ErrLeaseLost) {
		return nil, a.explain(ctx, key, act.Owner)
	}
	if err != nil {
		return nil, err
	}
	a.logger.InfoContext(ctx, "admin: "+verb, "tenant", key.Tenant, "key", key.ID, "force", act.Force, "reason", act.Reason)
	return a.load(ctx, key)
}

// refuse returns why an action presenting owner may not touch rec, or nil.
func refuse(rec *recovery.Record, owner uuid.UUID) error {
	switch {
	case rec.Owner != owner:
		return fmt.Errorf("key %q of tenant %q: %w (owner %s, not %s)", rec.Key.ID, rec.Key.Tenant, ErrChanged, rec.Owner, owner)
	case rec.Finished():
		return fmt.Errorf("key %q of tenant %q is %s: %w", rec.Key.ID, rec.Key.Tenant, rec.Status, ErrFinished)
	}
	return nil
}

// explain says why a write fenced by owner matched nothing: the record
// changed, finished, or its lease is valid.
func (a *Admin) explain(ctx context.Context, key recovery.Key, owner uuid.UUID) error {
	rec, err := a.store.Load(ctx, key)
	if err != nil {
		return err
	}
	if err := refuse(rec, owner); err != nil {
		return err
	}
	if rec.Status == recovery.StatusInFlight && !rec.LockedUntil.IsZero() {
		return &LiveLeaseError{Key: key, Until: rec.LockedUntil}
	}
	return fmt.Errorf("key %q of tenant %q: %w", key.ID, key.Tenant, ErrChanged)
}

// load returns key's record as a listing shows it.
func (a *Admin) load(ctx context.Context, key recovery.Key) (*Record, error) {
	rec, err := a.store.Load(ctx, key)
	if err != nil {
		return nil, err
	}
	r := summary(rec)
	return &r, nil
}

// RetryDead makes dead outbox message id deliverable now, with a fresh
// count of attempts (outbox.Retry: a message waiting out a backoff is
// revived too). A delivered message, or one a relay is delivering, is left
// alone: outbox.ErrNotFound.
func (a *Admin) RetryDead(ctx context.Context, id int64) error {
	if err := a.outbox.Retry(ctx, a.db, id); err != nil {
		return err
	}
	a.logger.InfoContext(ctx, "admin: retry outbox message", "id", id)
	return nil
}
