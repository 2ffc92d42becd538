package idemclient

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// The reasons a Client gives up on an intent, found with errors.Is on the
// error Do returns (a *GiveUpError).
var (
	// ErrBudgetExhausted: the Client's retry budget had no token left, so
	// the retry was not sent. The budget refills as new intents are sent.
	ErrBudgetExhausted = errors.New("idemclient: retry budget exhausted")

	// ErrKeyExpired: the next retry would have been sent too close to (or
	// after) the key's advertised expiry, when the server may have
	// forgotten the key and would run the request as a new one.
	ErrKeyExpired = errors.New("idemclient: the idempotency key expires before the next retry")

	// ErrAttemptsExhausted: Config.MaxAttempts attempts were made.
	ErrAttemptsExhausted = errors.New("idemclient: attempts exhausted")

	// ErrDeadline: Config.MaxElapsed, or the context's deadline, passed,
	// or would pass before the next retry could be sent: the client gives
	// up at once rather than sleep past it.
	ErrDeadline = errors.New("idemclient: deadline reached")

	// ErrCanceled: the caller's context was cancelled; its cause is the
	// GiveUpError's Err. (A context past its deadline is ErrDeadline.)
	ErrCanceled = errors.New("idemclient: context done")

	// ErrNotRetryable: an attempt failed with an error that a retry would
	// not mend (an unsupported scheme, a certificate refused, a redirect
	// refused); it is the GiveUpError's Err.
	ErrNotRetryable = errors.New("idemclient: the request failed and a retry would not help")

	// ErrBodyTooLarge: the request's body has no GetBody and is larger than
	// Config.MaxBody, so it cannot be buffered for retries. Nothing was
	// sent.
	ErrBodyTooLarge = errors.New("idemclient: request body too large to buffer for retries")
)

// GiveUpError is the error Do returns when it gives up on an intent: the
// last attempt's answer was retryable, or its error was, but no retry may
// be sent. The last response's body has been read (up to MaxErrorBody)
// and closed.
//
// The key is in Key: keep it with your intent and retry later with it, and
// the server still deduplicates, as long as its record of the key lives.
type GiveUpError struct {
	// Reason is why no retry was sent: one of ErrBudgetExhausted,
	// ErrKeyExpired, ErrAttemptsExhausted, ErrDeadline, ErrCanceled and
	// ErrNotRetryable.
	Reason error

	// Key is the idempotency key every attempt carried.
	Key string

	// Attempts is how many requests were sent.
	Attempts int

	// Status, Header and Body are the last response's, up to
	// MaxErrorBody bytes of body; Status is 0 when the last attempt got no
	// response.
	Status int
	Header http.Header
	Body   []byte

	// Err is the last attempt's error (or the context's), nil when it got
	// a response.
	Err error

	// Expires is the earliest end of the key's lifetime any attempt was
	// told (Idempotency-Key-Expires, read against the answer's Date and set
	// on this machine's clock); zero when none was. Keep it with the key:
	// a retry after it may run as a new request. The last attempt may have
	// got no answer, so Header need not hold it.
	Expires time.Time
}

// Error says why the client gave up, on which key, after how many
// attempts, and what the last attempt got.
func (e *GiveUpError) Error() string {
	last := fmt.Sprintf("last status %d", e.Status)
	if e.Err != nil {
		last = "last error: " + e.Err.Error()
	}
	attempts := "attempts"
	if e.Attempts == 1 {
		attempts = "attempt"
	}
	return fmt.Sprintf("%v (key %q, %d %s, %s)", e.Reason, e.Key, e.Attempts, attempts, last)
}

// Unwrap returns the reason and the last error, so that errors.Is finds
// either.
func (e *GiveUpError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Reason}
	}
	return []error{e.Reason, e.Err}
}

// ConfigError reports a Config field with a value New refuses.
type ConfigError struct {
	Field string // "MaxAttempts", "Budget.Ratio", …
	Value any
}

// Error names the field and its value.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("idemclient: Config.%s must not be negative (got %v)", e.Field, e.Value)
}
