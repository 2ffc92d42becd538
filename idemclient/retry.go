package idemclient

import (
	"crypto/tls"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// retryableStatus reports the answers a retry with the same key may mend:
// the key in flight (409), too early (425), too many requests (429) and
// the server's temporary failures. 501 and 505 will not change.
func retryableStatus(status int) bool {
	switch status {
	case http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests,
		http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// retryableError reports a transport error a retry may mend: the
// connection refused, reset or closed early, or the attempt timed out.
// The caller's own context is checked before; an error the connection
// did not cause (a bad URL, a refused certificate or redirect) is final.
func retryableError(err error) bool {
	var alert tls.AlertError
	if errors.As(err, &alert) {
		return false
	}
	var op *net.OpError
	var netErr net.Error
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE):
		return true
	case errors.As(err, &op):
		return true
	case errors.As(err, &netErr):
		return netErr.Timeout()
	}
	return false
}

// backoff returns the full-jitter delay before retry n (from 0): a random
// time in [0, min(maxDelay, base·2^n)].
func backoff(n int, base, maxDelay time.Duration) time.Duration {
	ceiling := maxDelay
	if n < 62 && base <= maxDelay>>n {
		ceiling = base << n
	}
	return randUpTo(ceiling)
}

// retryDelay is how long to wait before retry n after an answer that
// asked for retryAfter (0 for none): the backoff, but at least retryAfter
// plus a jitter of up to BaseDelay and a tenth of it, so that the clients
// a server turned away together do not all return at the same instant.
func retryDelay(n int, retryAfter, base, maxDelay time.Duration) time.Duration {
	d := backoff(n, base, maxDelay)
	if retryAfter > 0 {
		d = max(d, retryAfter+randUpTo(base+retryAfter/10))
	}
	return d
}

func randUpTo(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(d) + 1))
}

// maxRetryAfter caps what a server may ask for, so that the arithmetic
// cannot overflow; any wait this long is past every deadline.
const maxRetryAfter = 365 * 24 * time.Hour

// retryAfter reads Retry-After, delta-seconds or an HTTP-date; 0 when it
// is absent or does not parse. A date is read against the response's
// Date, when it has one, so that the two clocks' skew does not matter.
func retryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseUint(v, 10, 63); err == nil {
		return time.Duration(min(secs, uint64(maxRetryAfter/time.Second))) * time.Second
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	return min(max(at.Sub(serverNow(h, now)), 0), maxRetryAfter)
}

// expiry reads Idempotency-Key-Expires as a moment of the client's clock;
// ok is false when it is absent or does not parse. The server's Date
// carries whole seconds, truncated: the lifetime read against it may be a
// second too long, so a second is taken off.
func expiry(h http.Header, now time.Time) (time.Time, bool) {
	at, err := http.ParseTime(h.Get(ExpiresHeader))
	if err != nil {
		return time.Time{}, false
	}
	if _, err := http.ParseTime(h.Get("Date")); err != nil {
		return at, true
	}
	return now.Add(at.Sub(serverNow(h, now)) - time.Second), true
}

// serverNow is the response's Date, or now when it has none.
func serverNow(h http.Header, now time.Time) time.Time {
	if date, err := http.ParseTime(h.Get("Date")); err == nil {
		return date
	}
	return now
}
