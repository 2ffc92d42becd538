package recovery

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrInFlight reports that another attempt holds the key's lease. Retry
	// after a moment (HTTP 409 with Retry-After); *InFlightError says when.
	ErrInFlight = errors.New("a request with this idempotency key is in flight")

	// ErrMismatch reports that the key was used before with a different
	// request (HTTP 422). Replaying the old response would hide a client bug.
	ErrMismatch = errors.New("idempotency key reused with a different request")

	// ErrForbidden reports a claim by a principal other than the one that
	// made the key's record (ClaimParams.Principal): nothing ran, and
	// nothing about the record may be told to the caller, not even whether
	// it finished (HTTP 403).
	ErrForbidden = errors.New("idempotency key belongs to another principal")

	// ErrLeaseLost reports a fenced write that matched no row: the lease was
	// taken over (or released, or the record finished) and this attempt no
	// longer owns the key. Roll back what it wrote and stop.
	ErrLeaseLost = errors.New("lease lost: another attempt owns this idempotency key")

	// ErrParked reports a record parked for an operator (StatusParked): the
	// definition that wrote it cannot be resumed by the running one.
	// Nothing ran; retry after the operator resolved it (HTTP 503 with
	// Retry-After). *ParkedError says why.
	ErrParked = errors.New("idempotency key is parked: it waits for an operator")

	// ErrNotFound reports that no record exists for the key.
	ErrNotFound = errors.New("idempotency key not found")

	// ErrStarted reports DeleteUnstarted on a record that already committed a
	// recovery point: its effects exist, so the record must stay.
	ErrStarted = errors.New("idempotency key already has committed work")

	// ErrInvalidInput reports a tenant, key or operation name that breaks the
	// input rules; *InputError says which and why. Nothing is written.
	ErrInvalidInput = errors.New("invalid input")

	// ErrUnavailable reports that the database gave no connection or no
	// answer within the bound set for the work before anything runs (a
	// DBTimeout): nothing ran, and the request may be retried (HTTP 503
	// with Retry-After).
	ErrUnavailable = errors.New("database unavailable")
)

// InFlightError is the ErrInFlight a claim returns, with the time until the
// current lease expires, or the record's deferral ends, by the database
// clock.
type InFlightError struct {
	Key        Key
	RetryAfter time.Duration
	// Deferred says the record holds no lease but its last attempt deferred
	// it (Record.NotBefore): RetryAfter is the time until the deferral ends.
	Deferred bool
	// Contended says the claim found the key locked instead of reading a
	// valid lease: another transaction claims or takes it over (migration
	// 0017's key lock), its first phase perhaps still running, or, rarely,
	// a lock wait ran past the claim's lock_timeout (1 s), which a second
	// try may get past.
	Contended bool
}

// Error says which key is in flight and when its lease, or its deferral,
// ends.
func (e *InFlightError) Error() string {
	until := "lease ends"
	if e.Deferred {
		until = "deferred; it may be resumed"
	}
	return fmt.Sprintf("%v (tenant %q, key %q; %s in %s)", ErrInFlight, e.Key.Tenant, e.Key.ID, until, e.RetryAfter.Round(time.Millisecond))
}

// Is makes errors.Is(err, ErrInFlight) true.
func (e *InFlightError) Is(target error) bool { return target == ErrInFlight }

// InputError names the field that breaks the input rules and what is wrong
// with it.
type InputError struct {
	Field   string // "tenant", "key", "workflow", "request", ...
	Problem string // e.g. "is 300 bytes, longer than 255"
}

// Error names the field and the problem.
func (e *InputError) Error() string {
	return fmt.Sprintf("%v: %s %s", ErrInvalidInput, e.Field, e.Problem)
}

// Is makes errors.Is(err, ErrInvalidInput) true.
func (e *InputError) Is(target error) bool { return target == ErrInvalidInput }

// ParkedError is the ErrParked a claim returns for a parked record.
type ParkedError struct {
	Key Key
	// Reason is why the record was parked (Record.LastError).
	Reason string
}

// Error names the key and why it is parked.
func (e *ParkedError) Error() string {
	return fmt.Sprintf("%v (tenant %q, key %q): %s", ErrParked, e.Key.Tenant, e.Key.ID, e.Reason)
}

// Is makes errors.Is(err, ErrParked) true.
func (e *ParkedError) Is(target error) bool { return target == ErrParked }
