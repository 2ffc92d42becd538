package idemclient

import (
	"cmp"
	"math"
	"net/http"
	"time"
)

// Defaults of Config's fields.
const (
	MaxAttemptsDefault = 10
	BaseDelayDefault   = 100 * time.Millisecond
	MaxDelayDefault    = 30 * time.Second
	MaxElapsedDefault  = 2 * time.Minute
	WaitDefault        = 10 * time.Second
	MaxBodyDefault     = 8 << 20 // 8 MiB

	BudgetRatioDefault = 0.1
	BudgetBurstDefault = 10.0
)

// MaxErrorBody is the most of a retryable response's body a Client reads
// before closing it; GiveUpError.Body holds up to this much.
const MaxErrorBody = 64 << 10

// Config configures a Client. Its zero value is usable: every zero field
// means its default.
type Config struct {
	// HTTPClient sends the requests; nil means http.DefaultClient. Its
	// Timeout bounds each attempt (keep it above Wait); a timed-out attempt
	// is retried. The Client follows only redirects that keep the method
	// (307, 308), through HTTPClient's CheckRedirect; any other redirect
	// (a POST's 303 See Other, say) is the answer.
	HTTPClient *http.Client

	// MaxAttempts is the most requests sent for one intent, the first
	// included; 0 means MaxAttemptsDefault (10). 1 sends no retry.
	MaxAttempts int

	// BaseDelay and MaxDelay shape the backoff: before retry n (from 0) the
	// client sleeps a random time in [0, min(MaxDelay, BaseDelay·2^n)]
	// ("full jitter"), or longer when the server asks with Retry-After. 0
	// means BaseDelayDefault (100ms) and MaxDelayDefault (30s).
	BaseDelay time.Duration
	MaxDelay  time.Duration

	// MaxElapsed bounds one intent, from its first attempt: no retry is
	// sent, and no attempt runs, past it; the context's deadline bounds it
	// too. 0 means MaxElapsedDefault (2 minutes).
	MaxElapsed time.Duration

	// Wait is sent as "Prefer: wait=N" (RFC 7240), N its whole seconds
	// rounded up: a server that supports it holds the request up to that
	// long for a duplicate in flight to finish, instead of answering 409
	// at once. 0 means WaitDefault (10s); negative sends no Prefer.
	Wait time.Duration

	// MaxBody is the largest request body buffered for retries, for a
	// request without GetBody; a larger one makes Do fail with
	// ErrBodyTooLarge before sending. 0 means MaxBodyDefault (8 MiB).
	MaxBody int64

	// Budget bounds the retries all of the Client's intents make together.
	Budget BudgetConfig

	// Hooks are told of attempts, waits and give-ups.
	Hooks Hooks
}

// BudgetConfig sizes a Client's retry budget, a token bucket shared by
// all its intents: each intent's first attempt deposits Ratio tokens, up
// to Burst; each retry takes one token, and is not sent without one (a
// retry whose wait the caller's context ends gives its token back). The
// bucket starts full. So the requests a Client sends are at most
// (1+Ratio)·intents + Burst, however sick the server.
type BudgetConfig struct {
	// Ratio is the retries allowed per intent, on average; 0 means
	// BudgetRatioDefault (0.1).
	Ratio float64

	// Burst is the bucket's size: the retries allowed at once, before
	// new intents refill it; 0 means BudgetBurstDefault (10). Below 1, no
	// retry is ever sent; +Inf turns the budget off.
	Burst float64
}

// Hooks are called, when set, from the goroutine that calls Do, so from
// many goroutines at once when Do is: they must be safe for concurrent
// use, and quick.
type Hooks struct {
	// Attempt is called after each attempt, with its answer or error.
	Attempt func(AttemptInfo)

	// Wait is called before the client sleeps ahead of a retry.
	Wait func(WaitInfo)

	// GiveUp is called when the client gives up on an intent, just before
	// Do returns the *GiveUpError.
	GiveUp func(GiveUpInfo)
}

// AttemptInfo describes one attempt.
type AttemptInfo struct {
	Key      string
	Attempt  int           // from 1
	Status   int           // 0 when Err is set
	Err      error         // the transport's error, if any
	Duration time.Duration // from sending to the response's header
}

// WaitInfo describes the sleep before a retry.
type WaitInfo struct {
	Key     string
	Attempt int           // the attempt about to be sent, from 2
	Delay   time.Duration // how long the client sleeps
	// RetryAfter is what the server asked for (Retry-After), 0 when it
	// did not; Delay is at least this.
	RetryAfter time.Duration
	Status     int   // the answer that is retried, 0 when Err is set
	Err        error // the error that is retried
}

// GiveUpInfo describes giving up on an intent; Err is what Do returns.
type GiveUpInfo struct {
	Key      string
	Attempts int
	Reason   error // as GiveUpError.Reason
	Err      *GiveUpError
}

// withDefaults returns cfg with each zero field set to its default.
func (cfg Config) withDefaults() Config {
	cfg.HTTPClient = cmp.Or(cfg.HTTPClient, http.DefaultClient)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, MaxAttemptsDefault)
	cfg.BaseDelay = cmp.Or(cfg.BaseDelay, BaseDelayDefault)
	cfg.MaxDelay = cmp.Or(cfg.MaxDelay, MaxDelayDefault)
	cfg.MaxElapsed = cmp.Or(cfg.MaxElapsed, MaxElapsedDefault)
	cfg.Wait = cmp.Or(cfg.Wait, WaitDefault)
	cfg.MaxBody = cmp.Or(cfg.MaxBody, MaxBodyDefault)
	cfg.Budget.Ratio = cmp.Or(cfg.Budget.Ratio, BudgetRatioDefault)
	cfg.Budget.Burst = cmp.Or(cfg.Budget.Burst, BudgetBurstDefault)
	return cfg
}

// validate reports the first field that is negative (or NaN); Wait may
// be negative.
func (cfg Config) validate() error {
	checks := []struct {
		field string
		value any
		bad   bool
	}{
		{"MaxAttempts", cfg.MaxAttempts, cfg.MaxAttempts < 0},
		{"BaseDelay", cfg.BaseDelay, cfg.BaseDelay < 0},
		{"MaxDelay", cfg.MaxDelay, cfg.MaxDelay < 0},
		{"MaxElapsed", cfg.MaxElapsed, cfg.MaxElapsed < 0},
		{"MaxBody", cfg.MaxBody, cfg.MaxBody < 0},
		{"Budget.Ratio", cfg.Budget.Ratio, cfg.Budget.Ratio < 0 || math.IsNaN(cfg.Budget.Ratio)},
		{"Budget.Burst", cfg.Budget.Burst, cfg.Budget.Burst < 0 || math.IsNaN(cfg.Budget.Burst)},
	}
	for _, c := range checks {
		if c.bad {
			return &ConfigError{Field: c.field, Value: c.value}
		}
	}
	return nil
}
