package workflow

import (
	"errors"
	"fmt"

	"github.com/onceflow/onceflow/recovery"
)

// Errors callers branch on. The recovery sentinels are re-exported so that a
// caller of this package needs no other.
var (
	// ErrInFlight: another attempt holds the key (HTTP 409, Retry-After).
	// errors.As gives a *recovery.InFlightError with the time left.
	ErrInFlight = recovery.ErrInFlight
	// ErrMismatch: the key was used with a different request or workflow
	// (HTTP 422).
	ErrMismatch = recovery.ErrMismatch
	// ErrForbidden: the key's record was made by another principal (see
	// AsPrincipal); nothing ran (HTTP 403).
	ErrForbidden = recovery.ErrForbidden
	// ErrLeaseLost: another attempt took the key over while this one ran;
	// this attempt's uncommitted writes rolled back and it stopped.
	ErrLeaseLost = recovery.ErrLeaseLost
	// ErrInvalidInput: a key, tenant, request or definition breaks the
	// input rules; nothing was written (HTTP 400).
	ErrInvalidInput = recovery.ErrInvalidInput
	// ErrNotFound: Resume found no record for the key.
	ErrNotFound = recovery.ErrNotFound
	// ErrUnknownWorkflow: the record names a workflow this engine has not
	// registered, so it cannot be resumed here.
	ErrUnknownWorkflow = errors.New("unknown workflow")
	// ErrCrashed: a crash-point hook stopped the attempt as a process death
	// would (see Hooks).
	ErrCrashed = errors.New("attempt stopped at a crash point")
	// ErrUnavailable: the database gave no connection or no claim within
	// Config.DBTimeout; nothing ran (HTTP 503, Retry-After).
	ErrUnavailable = recovery.ErrUnavailable
	// ErrNotMigrated: onceflow's tables or functions are missing or older
	// than this build (HTTP 503); nothing ran. Its message names the schema
	// and the command that migrates it.
	ErrNotMigrated = recovery.ErrNotMigrated
)

// StepError is a step's failure: the lease was released (or, after
// MaxAttempts, the key failed terminally) and the record kept at its
// recovery point.
type StepError struct {
	Workflow string
	Step     string
	Attempt  int
	Err      error

	// Foreign is set when Err is what a foreign step's (or a
	// compensation's) own function returned: another system's failure,
	// never the engine's database's, whatever it looks like (a refused
	// connection, a read-only database of its own).
	Foreign bool
}

// markForeign marks err, when it is a *StepError, as a foreign function's
// failure, and returns it.
func markForeign(err error) error {
	if stepErr := (*StepError)(nil); errors.As(err, &stepErr) {
		stepErr.Foreign = true
	}
	return err
}

// Error names the workflow, the step (when the failure was in one) and the
// attempt.
func (e *StepError) Error() string {
	if e.Step == "" {
		return fmt.Sprintf("workflow %s (attempt %d): %v", e.Workflow, e.Attempt, e.Err)
	}
	return fmt.Sprintf("workflow %s: step %s (attempt %d): %v", e.Workflow, e.Step, e.Attempt, e.Err)
}

// Unwrap returns the step's error.
func (e *StepError) Unwrap() error { return e.Err }
