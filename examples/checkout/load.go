package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onceflow/onceflow/idemclient"
	"github.com/onceflow/onceflow/internal/sleep"
)

// `checkout load` drives a running checkout server with many intents, each
// one checkout under its own key, through one idemclient.Client, so that
// they share its retry budget; then it re-drives, with the same keys, the
// intents that gave up for a while (as a job queue hands a message out
// again), and sums up what happened.

// Bounds of a load run.
const (
	maxLoadIntents     = 100_000
	maxLoadConcurrency = 1_000
	// maxLoadAnswer is the most of a final answer's body kept.
	maxLoadAnswer = 64 << 10
	// maxRedriveRounds bounds the re-drives: an intent is re-driven at most
	// this many times.
	maxRedriveRounds = 3
	// redrivePause is the pause before re-drive round n (from 1), times n.
	redrivePause = time.Second
)

// loadConfig configures runLoad.
type loadConfig struct {
	URL         string  // the checkout server's base URL
	APIKey      string  // sent as Authorization: Bearer
	Intents     int     // checkouts, each under its own key; 1 to maxLoadIntents
	Concurrency int     // intents at once; 1 to maxLoadConcurrency
	Declines    float64 // the fraction of intents whose card is declined (a final 402)

	// Client is the idemclient configuration; runLoad adds its own hooks
	// after Client.Hooks and, when Client.HTTPClient is nil, an HTTP client
	// with a connection per worker and a timeout above Client.Wait.
	Client idemclient.Config

	// Redrive sends again, with the same key, each intent that gave up for
	// the budget, its attempts or its deadline, up to maxRedriveRounds
	// times; never one whose key may have expired.
	Redrive bool

	// beforeIntent, when set, is called before intent i (from 0) is first
	// sent; the intent waits for it. Tests shape the load with it.
	beforeIntent func(ctx context.Context, i int)
}

// loadReport is what a load run did.
type loadReport struct {
	Intents    int `json:"intents"`
	Succeeded  int `json:"succeeded"`   // a final 2xx
	Failed     int `json:"failed"`      // a final answer other than 2xx (a declined card: 402)
	GaveUp     int `json:"gave_up"`     // no final answer, after the re-drives
	NotStarted int `json:"not_started"` // interrupted before their first attempt

	// GaveUpBy counts the intents that gave up in the end by reason
	// (budget, attempts, deadline, key_expired, canceled, not_retryable).
	GaveUpBy map[string]int `json:"gave_up_by"`
	// Statuses counts the final answers by status.
	Statuses map[int]int `json:"statuses"`

	Attempts       int64 `json:"http_attempts"`   // requests sent, re-drives included
	Retries        int64 `json:"retries"`         // of which retries within an intent
	Replays        int   `json:"replays"`         // final answers with Idempotent-Replayed: true
	BudgetRefusals int64 `json:"budget_refusals"` // retries the budget refused, re-driven or not
	Redrives       int   `json:"redrives"`        // intents sent again with their key
	RedriveRounds  int   `json:"redrive_rounds"`

	ElapsedMS   int64 `json:"elapsed_ms"`
	Interrupted bool  `json:"interrupted"` // the run's context ended first

	// Results holds each intent's outcome, by index, for the tests.
	Results []intentResult `json:"-"`
}

// intentResult is one intent's outcome: a final answer, or giving up.
type intentResult struct {
	Key      string
	Started  bool
	Status   int    // the final answer's; 0 when it gave up
	Body     []byte // the final answer's, up to maxLoadAnswer
	Replayed bool
	GaveUp   error // the *idemclient.GiveUpError, or another error of Do
	Redrives int
}

// validate reports a config runLoad refuses.
func (cfg loadConfig) validate() error {
	switch {
	case cfg.URL == "":
		return errors.New("load: --url is required")
	case cfg.Intents < 1 || cfg.Intents > maxLoadIntents:
		return fmt.Errorf("load: --intents must be 1 to %d (got %d)", maxLoadIntents, cfg.Intents)
	case cfg.Concurrency < 1 || cfg.Concurrency > maxLoadConcurrency:
		return fmt.Errorf("load: --concurrency must be 1 to %d (got %d)", maxLoadConcurrency, cfg.Concurrency)
	case !(cfg.Declines >= 0 && cfg.Declines <= 1):
		return fmt.Errorf("load: --declines must be 0 to 1 (got %v)", cfg.Declines)
	}
	return nil
}

// loadRun is one run's client, intents and counters.
type loadRun struct {
	cfg     loadConfig
	client  *idemclient.Client
	results []intentResult

	attempts, retries, refusals atomic.Int64
}

// runLoad makes cfg.Intents checkouts against cfg.URL, cfg.Concurrency at
// once, then re-drives those that gave up for a while. When ctx ends it
// stops and reports what it has: the intents in flight give up (canceled),
// the others are not started.
func runLoad(ctx context.Context, cfg loadConfig) (loadReport, error) {
	if err := cfg.validate(); err != nil {
		return loadReport{}, err
	}
	r := &loadRun{cfg: cfg, results: make([]intentResult, cfg.Intents)}
	client, err := idemclient.New(r.clientConfig())
	if err != nil {
		return loadReport{}, fmt.Errorf("load: %w", err)
	}
	r.client = client
	start := time.Now()
	all := make([]int, cfg.Intents)
	for i := range all {
		all[i] = i
		r.results[i].Key = idemclient.NewKey() // the intent's key, kept for its re-drives
	}
	r.drive(ctx, all, cfg.beforeIntent)
	rounds := 0
	for cfg.Redrive && rounds < maxRedriveRounds && ctx.Err() == nil {
		again := r.toRedrive()
		if len(again) == 0 {
			break
		}
		rounds++
		if sleep.For(ctx, time.Duration(rounds)*redrivePause) != nil {
			break
		}
		for _, i := range again {
			r.results[i].Redrives++
		}
		r.drive(ctx, again, nil)
	}
	report := r.report(rounds)
	report.ElapsedMS = time.Since(start).Milliseconds()
	report.Interrupted = ctx.Err() != nil
	return report, nil
}

// clientConfig is cfg.Client with the run's counting hooks and, unless it
// has one, an HTTP client sized for the run.
func (r *loadRun) clientConfig() idemclient.Config {
	c := r.cfg.Client
	if c.HTTPClient == nil {
		transport := http.DefaultTransport.(*http.Transport).Clone()
		transport.MaxIdleConnsPerHost = r.cfg.Concurrency
		c.HTTPClient = &http.Client{Transport: transport, Timeout: max(c.Wait, idemclient.WaitDefault) + 30*time.Second}
	}
	hooks := c.Hooks
	c.Hooks = idemclient.Hooks{
		Attempt: func(a idemclient.AttemptInfo) {
			r.attempts.Add(1)
			if hooks.Attempt != nil {
				hooks.Attempt(a)
			}
		},
		Wait: func(w idemclient.WaitInfo) {
			r.retries.Add(1)
			if hooks.Wait != nil {
				hooks.Wait(w)
			}
		},
		GiveUp: func(g idemclient.GiveUpInfo) {
			if errors.Is(g.Reason, idemclient.ErrBudgetExhausted) {
				r.refusals.Add(1)
			}
			if hooks.GiveUp != nil {
				hooks.GiveUp(g)
			}
		},
	}
	return c
}

// drive sends the intents, concurrency at once, until done or ctx ends;
// before calls the test hook first.
func (r *loadRun) drive(ctx context.Context, intents []int, before func(context.Context, int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(r.cfg.Concurrency, len(intents)) {
		wg.Go(func() {
			for i := range next {
				if before != nil {
					before(ctx, i)
				}
				r.send(ctx, i)
			}
		})
	}
	for _, i := range intents {
		select {
		case next <- i:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(next)
	wg.Wait()
}

// send runs intent i once: one Do, with its key.
func (r *loadRun) send(ctx context.Context, i int) {
	res := &r.results[i]
	if ctx.Err() != nil {
		return // not sent: a re-drive keeps its last outcome
	}
	res.Started = true
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(r.cfg.URL, "/")+"/v1/checkouts",
		strings.NewReader(r.body(i)))
	if err != nil {
		res.GaveUp = err
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemclient.KeyHeader, res.Key)
	if r.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+r.cfg.APIKey)
	}
	resp, err := r.client.Do(ctx, req)
	if err != nil {
		res.GaveUp = err
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxLoadAnswer))
	res.Status, res.Body, res.Replayed, res.GaveUp = resp.StatusCode, body, resp.Replayed, nil
}

// body is intent i's checkout: its own customer and amount, and a card
// that is declined for a fraction cfg.Declines of the intents, spread evenly.
func (r *loadRun) body(i int) string {
	card := "tok_visa"
	if math.Floor(float64(i+1)*r.cfg.Declines) > math.Floor(float64(i)*r.cfg.Declines) {
		card = tokDecline
	}
	req := CheckoutRequest{CustomerID: fmt.Sprintf("cus_load_%d", i), AmountCents: int64(100 + i%900), Currency: "usd",
		CardToken: card, Items: []Item{{SKU: "book", Qty: 1 + i%3}}}
	b, _ := json.Marshal(req)
	return string(b)
}

// toRedrive lists the intents that gave up for a while: for the budget,
// their attempts or their deadline. Not one whose key may have expired
// (the server may have forgotten it, and would run it again), nor one
// cancelled or refused for good.
func (r *loadRun) toRedrive() []int {
	var again []int
	for i, res := range r.results {
		if res.GaveUp != nil && (errors.Is(res.GaveUp, idemclient.ErrBudgetExhausted) ||
			errors.Is(res.GaveUp, idemclient.ErrAttemptsExhausted) ||
			errors.Is(res.GaveUp, idemclient.ErrDeadline)) && !errors.Is(res.GaveUp, idemclient.ErrKeyExpired) {
			again = append(again, i)
		}
	}
	return again
}

// report sums up the results.
func (r *loadRun) report(rounds int) loadReport {
	rep := loadReport{Intents: r.cfg.Intents, GaveUpBy: map[string]int{}, Statuses: map[int]int{},
		Attempts: r.attempts.Load(), Retries: r.retries.Load(), BudgetRefusals: r.refusals.Load(),
		RedriveRounds: rounds, Results: r.results}
	for _, res := range r.results {
		rep.Redrives += res.Redrives
		switch {
		case !res.Started:
			rep.NotStarted++
		case res.GaveUp != nil:
			rep.GaveUp++
			rep.GaveUpBy[reasonName(res.GaveUp)]++
		default:
			rep.Statuses[res.Status]++
			if res.Replayed {
				rep.Replays++
			}
			if res.Status >= 200 && res.Status < 300 {
				rep.Succeeded++
			} else {
				rep.Failed++
			}
		}
	}
	return rep
}

// reasonName names why an intent gave up, for the report.
func reasonName(err error) string {
	for _, r := range []struct {
		err  error
		name string
	}{
		{idemclient.ErrBudgetExhausted, "budget"},
		{idemclient.ErrAttemptsExhausted, "attempts"},
		{idemclient.ErrDeadline, "deadline"},
		{idemclient.ErrKeyExpired, "key_expired"},
		{idemclient.ErrCanceled, "canceled"},
		{idemclient.ErrNotRetryable, "not_retryable"},
	} {
		if errors.Is(err, r.err) {
			return r.name
		}
	}
	return "error"
}
