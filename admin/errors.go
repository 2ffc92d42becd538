package admin

import (
	"errors"
	"fmt"
	"time"

	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/recovery"
)

var (
	// ErrInvalidInput reports a filter, cursor, key or setting that breaks
	// the input rules; nothing is read or written. It is
	// recovery.ErrInvalidInput.
	ErrInvalidInput = recovery.ErrInvalidInput

	// ErrNotFound reports an unknown key. It is recovery.ErrNotFound.
	ErrNotFound = recovery.ErrNotFound

	// ErrMessageNotFound reports a message RetryDead cannot retry:
	// unknown, delivered, or being delivered. It is outbox.ErrNotFound.
	ErrMessageNotFound = outbox.ErrNotFound

	// ErrChanged reports an action refused because the record is no longer
	// as the operator read it: another owner token holds it (a takeover, a
	// release, another operator). Nothing was written; look again.
	ErrChanged = errors.New("the record changed since it was read")

	// ErrFinished reports an action on a record that is completed, failed
	// or compensated: there is nothing to change.
	ErrFinished = errors.New("the record is finished")

	// ErrLeaseLive reports an action refused because the record's lease is
	// still valid: its holder may be at work. Errors that match it are
	// *LiveLeaseError values. Force the action to override it.
	ErrLeaseLive = errors.New("the record's lease is still valid")

	// ErrForbidden, returned by Config.Authorize, answers 403 rather than
	// 401: the operator is known but may not use the console.
	ErrForbidden = errors.New("forbidden")
)

// LiveLeaseError is the ErrLeaseLive an action returns: the record's lease
// runs until Until, by the database clock.
type LiveLeaseError struct {
	Key   recovery.Key
	Until time.Time
}

func (e *LiveLeaseError) Error() string {
	return fmt.Sprintf("%v: key %q of tenant %q is leased until %s; its holder may still be at work (force to act anyway)",
		ErrLeaseLive, e.Key.ID, e.Key.Tenant, e.Until.Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrLeaseLive) true.
func (e *LiveLeaseError) Is(target error) bool { return target == ErrLeaseLive }
