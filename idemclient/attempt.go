package idemclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"
)

// errAttemptDeadline is the error of an attempt cut off at the intent's
// deadline.
var errAttemptDeadline = errors.New("idemclient: the attempt ran into the intent's deadline")

// send makes one attempt, cut off at the intent's deadline. A response's
// body stays readable past the deadline: the caller reads a final one.
func (in *intent) send(ctx context.Context) (*http.Response, error) {
	in.attempts++
	actx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(in.deadline.Sub(in.c.clock.Now()), cancel)
	sent := in.c.clock.Now()
	resp, err := in.do(actx)
	in.timedOut = !timer.Stop()
	if in.timedOut && err == nil {
		_ = resp.Body.Close()
		resp, err = nil, errAttemptDeadline
	}
	if hook := in.c.cfg.Hooks.Attempt; hook != nil {
		info := AttemptInfo{Key: in.key, Attempt: in.attempts, Err: err, Duration: in.c.clock.Now().Sub(sent)}
		if resp != nil {
			info.Status = resp.StatusCode
		}
		hook(info)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// do sends the intent's request once, with a fresh copy of its body after
// the first attempt.
func (in *intent) do(ctx context.Context) (*http.Response, error) {
	req := in.req.Clone(ctx)
	if in.attempts > 1 && in.req.GetBody != nil {
		body, err := in.req.GetBody()
		if err != nil {
			return nil, err
		}
		req.Body = body
	}
	resp, err := in.c.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, err // a response that comes with an error is closed already
	}
	return resp, nil
}

// cancelOnClose ends an attempt's context once its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// final wraps the final answer.
func (in *intent) final(resp *http.Response) *Response {
	return &Response{Response: resp, Key: in.key, Replayed: replayed(resp), Attempts: in.attempts}
}

// replayed reports an answer the server replayed from its record of the
// key (Idempotent-Replayed: true): whatever its status, a retry gets it
// again.
func replayed(resp *http.Response) bool {
	return strings.EqualFold(strings.TrimSpace(resp.Header.Get(ReplayedHeader)), "true")
}

// record keeps what the last attempt got, reading (up to MaxErrorBody)
// and closing its body, and the key's expiry when the server said it.
func (in *intent) record(resp *http.Response, err error) {
	in.status, in.header, in.body, in.err = 0, nil, nil, err
	if resp == nil {
		return
	}
	defer func() { _ = resp.Body.Close() }()
	in.status, in.header = resp.StatusCode, resp.Header
	in.body, _ = io.ReadAll(io.LimitReader(resp.Body, MaxErrorBody))
	if at, ok := expiry(resp.Header, in.c.clock.Now()); ok && (in.expires.IsZero() || at.Before(in.expires)) {
		in.expires = at
	}
}

// retry decides on a retry after a retryable answer or error. It sleeps
// until the retry is due and returns nil, or returns why no retry may be
// sent.
func (in *intent) retry(ctx context.Context) error {
	cfg := in.c.cfg
	switch {
	case ctx.Err() != nil:
		return in.contextDone(ctx)
	case in.timedOut:
		return ErrDeadline
	case in.err != nil && !retryableError(in.err):
		return ErrNotRetryable
	case in.attempts >= cfg.MaxAttempts:
		return ErrAttemptsExhausted
	}
	now := in.c.clock.Now()
	asked := retryAfter(in.header, now)
	delay := retryDelay(in.attempts-1, asked, cfg.BaseDelay, cfg.MaxDelay)
	at := now.Add(delay)
	switch {
	case !in.expires.IsZero() && at.After(in.expires.Add(-in.margin())):
		return ErrKeyExpired
	case at.After(in.deadline):
		return ErrDeadline
	case !in.c.budget.take():
		return ErrBudgetExhausted
	}
	if hook := cfg.Hooks.Wait; hook != nil {
		hook(WaitInfo{Key: in.key, Attempt: in.attempts + 1, Delay: delay, RetryAfter: asked, Status: in.status, Err: in.err})
	}
	if err := in.c.clock.Sleep(ctx, delay); err != nil {
		in.c.budget.refund() // the retry is not sent
		return in.contextDone(ctx)
	}
	return nil
}

// margin is how long before the key's expiry the last retry is sent: a
// tenth of the key's lifetime as first seen, at most a minute, so that
// the retry arrives while the server still has the record.
func (in *intent) margin() time.Duration {
	return max(0, min(time.Minute, in.expires.Sub(in.start)/10))
}

// contextDone gives the reason for the caller's context being done:
// ErrDeadline for its deadline, ErrCanceled otherwise; its cause becomes
// the last error when the last attempt had none.
func (in *intent) contextDone(ctx context.Context) error {
	if in.err == nil || !errors.Is(in.err, ctx.Err()) {
		in.err = context.Cause(ctx)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ErrDeadline
	}
	return ErrCanceled
}

// giveUp returns the error for giving up for reason, having told the hook.
func (in *intent) giveUp(reason error) *GiveUpError {
	g := &GiveUpError{Reason: reason, Key: in.key, Attempts: in.attempts,
		Status: in.status, Header: in.header, Body: in.body, Err: in.err, Expires: in.expires}
	if hook := in.c.cfg.Hooks.GiveUp; hook != nil {
		hook(GiveUpInfo{Key: in.key, Attempts: in.attempts, Reason: reason, Err: g})
	}
	return g
}
