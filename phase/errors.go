package phase

import (
	"errors"
	"fmt"
	"time"
)

// permanentError marks an error no retry can fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as permanent: retrying the step cannot fix it (a
// card declined, a request the other system refuses as invalid). A step
// that returns it is not retried, and the workflow fails terminally at
// once instead of after MaxAttempts. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked by
// Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// DeferError asks the engine to stop the attempt and hand the key back
// until After has passed: the other system said when to come back
// (Retry-After) and that is longer than it is worth holding the key's lease
// idle. No claim, retry or completer takes the key over before then; a
// client's retry meanwhile gets ErrInFlight with the time left. It counts
// as an attempt, so that MaxAttempts bounds a downstream that defers for
// ever. Return it with Defer.
type DeferError struct {
	After time.Duration
	Err   error
}

// Error says how long the step defers and why.
func (e *DeferError) Error() string {
	return fmt.Sprintf("deferred for %s: %v", e.After.Round(time.Millisecond), e.Err)
}

// Unwrap returns the reason.
func (e *DeferError) Unwrap() error { return e.Err }

// Defer returns a *DeferError: stop, hand the key back, and let nothing
// resume it for after.
func Defer(after time.Duration, err error) error { return &DeferError{After: after, Err: err} }
