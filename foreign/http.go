package foreign

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RetryAfterMax bounds the Retry-After an *HTTPError carries: a longer one
// (or one too large to read) is taken as RetryAfterMax.
const RetryAfterMax = time.Hour

// HTTPError is an HTTP answer that is not a success, as CheckResponse
// reports it.
type HTTPError struct {
	// Status is the response's status code.
	Status int
	// RetryAfter is how long the response asked the client to wait
	// (Retry-After, in seconds or as a date), at most RetryAfterMax; 0 when
	// it did not ask or the header was unreadable.
	RetryAfter time.Duration
}

// Error gives the status and the wait asked for, if any.
func (e *HTTPError) Error() string {
	msg := fmt.Sprintf("HTTP %d %s", e.Status, http.StatusText(e.Status))
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf(" (retry after %s)", e.RetryAfter)
	}
	return msg
}

// CheckResponse classifies the answer of another system: nil for a 2xx;
// a transient *HTTPError for 408, 425, 429 and 5xx, which a Retry tries
// again (no sooner than its Retry-After); and Permanent(*HTTPError) for any
// other status (400, 404, 422, a redirect not followed), which no retry can
// fix. An error from the HTTP client itself (a refused connection, a
// timeout) is transient as it is: return it unmarked. CheckResponse reads
// only the status and headers; closing the body is still the caller's.
func CheckResponse(resp *http.Response) error {
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300:
		return nil
	case s == http.StatusRequestTimeout, s == http.StatusTooEarly, s == http.StatusTooManyRequests, s >= 500 && s < 600:
		return &HTTPError{Status: s, RetryAfter: retryAfterOf(resp.Header, time.Now())}
	default:
		return Permanent(&HTTPError{Status: s})
	}
}

// retryAfterOf reads h's Retry-After: delay-seconds, or an HTTP-date taken
// relative to h's Date (the sender's clock, so that a skewed local clock
// does not count), or to now when h has none. The result is between 0 and
// RetryAfterMax; an unreadable header, or a date past, gives 0.
func retryAfterOf(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if strings.Trim(v, "0123456789") == "" {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || secs > int64(RetryAfterMax/time.Second) {
			return RetryAfterMax // only digits: too many of them
		}
		return time.Duration(secs) * time.Second
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	if date, err := http.ParseTime(h.Get("Date")); err == nil {
		now = date
	}
	return min(max(at.Sub(now), 0), RetryAfterMax)
}
