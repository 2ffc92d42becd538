package idemclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Client sends requests under idempotency keys and retries them while a
// retry may succeed and its budget allows. It is safe for concurrent use;
// all of a Client's calls share one retry budget, so use one Client per
// server (or per process) rather than one per call.
type Client struct {
	cfg    Config
	budget *budget
	clock  clock
}

// New returns a Client configured by cfg, its zero fields set to their
// defaults. A negative field is a *ConfigError.
func New(cfg Config) (*Client, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	cfg.HTTPClient = keepingMethod(cfg.HTTPClient)
	return &Client{cfg: cfg, budget: newBudget(cfg.Budget), clock: wallClock{}}, nil
}

// maxRedirects is how many redirects net/http follows when the client
// has no CheckRedirect of its own.
const maxRedirects = 10

// keepingMethod returns a copy of hc that follows only the redirects that
// send the same request again (307, 308: same method, body and key), and
// returns any other (301, 302 or 303 of a POST, which would become a GET
// without the body) as the answer: the follow-up is another request, which
// the intent's key does not name, and its answer is not the intent's.
// hc's own CheckRedirect still decides on the redirects followed.
func keepingMethod(hc *http.Client) *http.Client {
	copied := *hc
	check := hc.CheckRedirect
	copied.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		switch {
		case req.Method != via[0].Method:
			return http.ErrUseLastResponse
		case check != nil:
			return check(req, via)
		case len(via) >= maxRedirects:
			return fmt.Errorf("idemclient: stopped after %d redirects", maxRedirects)
		}
		return nil
	}
	return &copied
}

// NewKey returns a new idempotency key, a UUIDv7: unique, and ordered by
// time, which keeps the server's index of keys compact.
//
// Do makes a key itself when the request has none, but that key lives only
// as long as the call. When the intent must survive a restart (a payment
// an order page asked for, a job a queue hands out again), make the key
// first, store it with the intent, in the same transaction, and set it on
// every request for that intent: a process that dies between sending and
// hearing the answer then retries, after restarting, with the same key,
// and the server answers with what it did the first time instead of doing
// it again.
func NewKey() string {
	return uuid.Must(uuid.NewV7()).String()
}

// Response is the final answer to an intent: a success, or an answer that
// a retry would not change (a 4xx but 409, 425 and 429; 501; 505; any
// answer the server replayed from its record). Close its Body as with any
// *http.Response.
type Response struct {
	*http.Response

	// Key is the idempotency key every attempt carried.
	Key string

	// Replayed is true when the server answered from its record of the key
	// (Idempotent-Replayed: true): the work was done before, by an earlier
	// attempt or an earlier process, and not done again.
	Replayed bool

	// Attempts is how many requests were sent, from 1.
	Attempts int
}

// Do sends req under an idempotency key, and retries it, with the same key
// and the same body, while the answer is retryable: a transport error, or
// 409 (the key in flight), 425, 429, 500, 502, 503 or 504, unless the
// server replayed it from its record (Idempotent-Replayed: true: the
// key's answer for good, a handler's own 409, say). Each call is one
// intent: req's Idempotency-Key is kept when it has one, else a new key
// (NewKey) is made and sent on every attempt.
//
// Do returns the final answer with a nil error, whatever its status. When
// it gives up (budget, attempts, deadline, key lifetime, context) it
// returns a *GiveUpError, which errors.Is matches against ErrBudgetExhausted
// and the other reasons, and a nil *Response. req is not modified, and
// ctx, not req's own context, governs the attempts; req's body is
// buffered (up to Config.MaxBody) when it has no GetBody.
func (c *Client) Do(ctx context.Context, req *http.Request) (*Response, error) {
	in, err := c.start(ctx, req)
	if err != nil {
		return nil, err
	}
	for {
		resp, err := in.send(ctx) //nolint:bodyclose // returned to the caller, or read and closed by record
		if err == nil && (!retryableStatus(resp.StatusCode) || replayed(resp)) {
			return in.final(resp), nil
		}
		in.record(resp, err)
		if reason := in.retry(ctx); reason != nil {
			return nil, in.giveUp(reason)
		}
	}
}

// intent is one Do call: its request, key and bounds, and what its last
// attempt got.
type intent struct {
	c        *Client
	req      *http.Request // a clone of the caller's, with key, Prefer and a replayable body
	key      string
	start    time.Time
	deadline time.Time // Config.MaxElapsed from start, or the context's deadline
	expires  time.Time // the earliest Idempotency-Key-Expires seen; zero until one is
	attempts int

	// The last attempt's answer, or error.
	status   int
	header   http.Header
	body     []byte
	err      error
	timedOut bool // it ran into the deadline
}

// start prepares the intent: its key, its Prefer header, its body, and
// its deadline; and deposits its share in the retry budget.
func (c *Client) start(ctx context.Context, req *http.Request) (*intent, error) {
	if req == nil {
		return nil, errors.New("idemclient: nil request")
	}
	req = req.Clone(ctx)
	if err := c.replayable(req); err != nil {
		return nil, err
	}
	key := req.Header.Get(KeyHeader)
	if key == "" {
		key = NewKey()
		req.Header.Set(KeyHeader, key)
	}
	if c.cfg.Wait > 0 && !prefersWait(req.Header) {
		req.Header.Add(PreferHeader, "wait="+strconv.FormatInt(int64((c.cfg.Wait+time.Second-1)/time.Second), 10))
	}
	now := c.clock.Now()
	deadline := now.Add(c.cfg.MaxElapsed)
	if d, ok := ctx.Deadline(); ok {
		deadline = minTime(deadline, now.Add(time.Until(d)))
	}
	c.budget.deposit()
	return &intent{c: c, req: req, key: key, start: now, deadline: deadline}, nil
}

// replayable makes req's body readable once per attempt: through GetBody
// when req has one, else by buffering it, up to MaxBody.
func (c *Client) replayable(req *http.Request) error {
	if req.Body == nil || req.Body == http.NoBody || req.GetBody != nil {
		return nil
	}
	data, err := io.ReadAll(io.LimitReader(req.Body, c.cfg.MaxBody+1))
	closeErr := req.Body.Close()
	switch {
	case err != nil:
		return fmt.Errorf("idemclient: read request body: %w", err)
	case int64(len(data)) > c.cfg.MaxBody:
		return fmt.Errorf("%w: over %d bytes (Config.MaxBody); give the request a GetBody", ErrBodyTooLarge, c.cfg.MaxBody)
	case closeErr != nil:
		return fmt.Errorf("idemclient: close request body: %w", closeErr)
	}
	req.ContentLength = int64(len(data))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	req.Body, _ = req.GetBody()
	return nil
}

// prefersWait reports a Prefer header that states a wait already.
func prefersWait(h http.Header) bool {
	for _, v := range h.Values(PreferHeader) {
		for pref := range strings.SplitSeq(v, ",") {
			name, _, _ := strings.Cut(pref, "=")
			name, _, _ = strings.Cut(name, ";")
			if strings.EqualFold(strings.TrimSpace(name), "wait") {
				return true
			}
		}
	}
	return false
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
