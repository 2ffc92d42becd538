package idemhttp

import (
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/onceflow/onceflow/internal/sleep"
	"github.com/onceflow/onceflow/recovery"
)

// MaxWaitDefault is the longest a request waits for its key in flight when
// it sends Prefer: wait=N (Config.MaxWait).
const MaxWaitDefault = 10 * time.Second

// MaxWaitersDefault is how many requests may wait for their keys at once
// (Config.MaxWaiters).
const MaxWaitersDefault = 1000

// PreferenceAppliedHeader is the response header (RFC 7240) that says a
// request waited for its key: wait=N, the seconds it was allowed to wait.
const PreferenceAppliedHeader = "Preference-Applied"

// The pauses between the claims of a waiting request: the first, doubled
// after each claim up to the last, with jitter.
const (
	firstPoll = 25 * time.Millisecond
	maxPoll   = 500 * time.Millisecond
)

// waiter lets requests whose key is in flight wait for it (Prefer: wait).
// A waiting request holds no connection: it claims the key again, with
// backoff, until the claim answers otherwise or its wait is over.
type waiter struct {
	max    time.Duration // the longest wait; 0 or less: never wait
	limit  int64         // how many requests may wait at once
	active atomic.Int64
	polled func() // see Config.polled
}

// await returns err, a claim's error, unless it says the key is in flight
// and r prefers to wait: then it claims again until the claim answers
// otherwise or the wait is over, and returns the last claim's error. The
// wait is what Prefer asks, at most w.max; it ends early when r's client
// goes away. When it waited, it says so on rw: Preference-Applied.
func (w *waiter) await(rw http.ResponseWriter, r *http.Request, err error, claim func() error) error {
	var inFlight *recovery.InFlightError
	if !errors.As(err, &inFlight) {
		return err
	}
	wait := min(preferredWait(r.Header.Values("Prefer")), w.max)
	if wait <= 0 || !w.enter() {
		return err
	}
	defer w.active.Add(-1)
	deadline := time.Now().Add(wait)
	for backoff := firstPoll; ; backoff = min(2*backoff, maxPoll) {
		pause, ok := nextPause(inFlight, backoff, time.Until(deadline))
		if !ok {
			return err
		}
		rw.Header().Set(PreferenceAppliedHeader, "wait="+strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		if w.polled != nil {
			w.polled()
		}
		if sleep.For(r.Context(), pause) != nil {
			return err
		}
		if err = claim(); !errors.As(err, &inFlight) {
			return err
		}
	}
}

// enter takes a waiter's slot, or reports false when all are taken.
func (w *waiter) enter() bool {
	if w.active.Add(1) > w.limit {
		w.active.Add(-1)
		return false
	}
	return true
}

// nextPause returns how long to pause before claiming again, given the
// claim's answer, the backoff and the wait left: the backoff, less up to
// half of it at random, and never beyond the wait left. It reports false
// when claiming again within the wait left is pointless: no wait is left,
// or the key is deferred for longer than it.
func nextPause(inFlight *recovery.InFlightError, backoff, left time.Duration) (time.Duration, bool) {
	if left <= 0 || inFlight.Deferred && inFlight.RetryAfter > left {
		return 0, false
	}
	pause := backoff - rand.N(backoff/2+1)
	if inFlight.Deferred {
		pause = max(pause, inFlight.RetryAfter)
	}
	return min(pause, left), true
}

// maxWaitSeconds bounds the seconds preferredWait reads, so that no
// number of digits overflows; any longer wait is capped by MaxWait anyway.
const maxWaitSeconds = 1 << 30

// preferredWait reads the wait preference (RFC 7240, section 4.3) of the
// Prefer header values: wait=N, N seconds (delta-seconds, also as a quoted
// string). Preferences are a comma-separated list, in one header or
// several; names are case-insensitive; only the first wait counts, and
// parameters after ";" are ignored. It returns 0 when there is none or its
// value is not delta-seconds; a value of many digits is read as
// maxWaitSeconds.
func preferredWait(values []string) time.Duration {
	for _, v := range values {
		for pref := range splitUnquoted(v, ',') {
			pref, _, _ = strings.Cut(pref, ";") // ';' does not occur in delta-seconds
			name, value, _ := strings.Cut(pref, "=")
			if !strings.EqualFold(trimOWS(name), "wait") {
				continue
			}
			return time.Duration(deltaSeconds(trimOWS(value))) * time.Second
		}
	}
	return 0
}

// deltaSeconds reads 1*DIGIT, or the same as a quoted string, capped at
// maxWaitSeconds; anything else is 0.
func deltaSeconds(value string) int64 {
	if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
		value = value[1 : len(value)-1]
	}
	if value == "" {
		return 0
	}
	var n int64
	for i := range len(value) {
		c := value[i]
		if c < '0' || c > '9' {
			return 0
		}
		n = min(10*n+int64(c-'0'), maxWaitSeconds)
	}
	return n
}

// splitUnquoted yields the parts of s between the separators sep that
// are not inside a quoted string (with backslash escapes).
func splitUnquoted(s string, sep byte) func(yield func(string) bool) {
	return func(yield func(string) bool) {
		start, quoted := 0, false
		for i := 0; i < len(s); i++ {
			switch c := s[i]; {
			case quoted && c == '\\':
				i++
			case c == '"':
				quoted = !quoted
			case !quoted && c == sep:
				if !yield(s[start:i]) {
					return
				}
				start = i + 1
			}
		}
		yield(s[start:])
	}
}
