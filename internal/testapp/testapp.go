// Package testapp is the one checkout the repository's tests run, and the
// one fake provider it calls: every package's tests that need "a
// workflow like a user's" use these instead of declaring their own, so a
// change to the shape of a checkout is made once.
//
// Checkout is create_order (atomic) → charge (foreign, over HTTP to a
// Provider, with the derived key) → record_charge (atomic). Its tables are
// made by Schema. A test of compensation gives the charge a refund
// (Options.Charge: foreign.Compensate(Refund(url))) and makes
// record_charge fail for good (Options.Before returning a phase.Permanent
// error). A test whose point is a different shape (two foreign calls in a
// row, a step that blocks) declares that workflow itself.
package testapp

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// Order is the checkout's request.
type Order struct {
	Customer string `json:"customer"`
	Amount   int64  `json:"amount"`
	Card     string `json:"card"`
}

// State is the checkout's state, and its response body.
type State struct {
	OrderID  int64  `json:"order_id"`
	ChargeID string `json:"charge_id,omitempty"`
	Declined bool   `json:"declined,omitempty"`
	Status   string `json:"status,omitempty"`
}

// DeclinedCard is the card the charge declines, without calling the
// provider: record_charge marks the order declined and responds 402.
const DeclinedCard = "decline"

// Schema makes the checkout's tables: orders, and a ledger row per paid
// order.
const Schema = `
	CREATE TABLE orders (id bigserial PRIMARY KEY, tenant text NOT NULL, key text NOT NULL,
		customer text NOT NULL, amount bigint NOT NULL, status text NOT NULL, charge_id text);
	CREATE TABLE ledger (id bigserial PRIMARY KEY, order_id bigint NOT NULL, entry text NOT NULL)`

// Options adapts the checkout to a test.
type Options struct {
	// Before, if set, runs at the start of every step with the step's
	// name; an error fails the step. A test uses it to fail, block or panic
	// at a step.
	Before func(ctx context.Context, step string) error
	// Charge are the charge step's options (a foreign.Retry, a
	// foreign.Timeout).
	Charge []foreign.Option
}

// Checkout is the checkout workflow, charging through the Provider at
// providerURL.
func Checkout(providerURL string, opts Options) *workflow.Workflow[Order, State] {
	before := func(ctx context.Context, step string) error {
		if opts.Before == nil {
			return nil
		}
		return opts.Before(ctx, step)
	}
	return workflow.Define("checkout",
		phase.Atomic("create_order", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, State]) error {
			if err := before(ctx, r.Step); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `INSERT INTO orders (tenant, key, customer, amount, status)
				VALUES ($1, $2, $3, $4, 'new') RETURNING id`,
				r.Key.Tenant, r.Key.ID, r.Request.Customer, r.Request.Amount).Scan(&r.State.OrderID)
		}),
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[Order, State]) error {
			if err := before(ctx, c.Step); err != nil {
				return err
			}
			if c.Request.Card == DeclinedCard {
				c.State.Declined = true
				return nil
			}
			id, err := Call(ctx, providerURL, "charges", c.Key)
			if err != nil {
				return err
			}
			c.State.ChargeID = id
			return nil
		}, opts.Charge...),
		phase.Atomic("record_charge", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, State]) error {
			if err := before(ctx, r.Step); err != nil {
				return err
			}
			if r.State.Declined {
				if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'declined' WHERE id = $1`, r.State.OrderID); err != nil {
					return err
				}
				return workflow.Respond(workflow.Problem(402, "card declined"))
			}
			r.State.Status = "paid"
			if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid', charge_id = $2 WHERE id = $1`,
				r.State.OrderID, r.State.ChargeID); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, entry) VALUES ($1, 'charged')`, r.State.OrderID)
			return err
		}),
	).Finish(func(s *State) workflow.Response { return workflow.JSON(201, s) })
}

// Provider is a fake service over real HTTP, as other systems are: a POST
// to any path (the endpoint: /charges, /reservations, ...) with an
// Idempotency-Key makes one effect per key and endpoint and answers
// {"id": ...}, the same id for the same key, as real providers
// deduplicate. It counts effects and calls. Fail makes it answer the next
// calls with faults, as a provider having a bad moment does.
type Provider struct {
	*httptest.Server
	mu      sync.Mutex
	effects map[string]map[string]string // endpoint -> key -> id
	undoes  map[string]map[string]string // endpoint -> key -> the key its first call named in ?of=
	keys    map[string][]string          // endpoint -> keys in call order
	traces  map[string][]string          // endpoint -> the calls' traceparent headers, in call order
	faults  map[string][]Fault           // endpoint -> the next calls' faults
	closing chan struct{}                // closed when the test ends: hung calls answer
	latency time.Duration                // how long a served call takes
	running int                          // calls being served now
	most    int                          // the most calls served at once
	arrived []time.Time                  // when each call arrived, in order
}

// Fault is how a Provider answers one call instead of serving it.
type Fault struct {
	// Status, if not 0, is the answer's status, with Header set on it
	// (Retry-After, Date); the call makes no effect.
	Status int
	Header http.Header
	// Hang makes the call's effect and then holds the answer back until the
	// client gives up: a call whose answer is lost.
	Hang bool
}

// NewProvider starts a Provider, closed when t ends.
func NewProvider(t testing.TB) *Provider {
	p := &Provider{effects: map[string]map[string]string{}, undoes: map[string]map[string]string{}, keys: map[string][]string{}, traces: map[string][]string{},
		faults: map[string][]Fault{}, closing: make(chan struct{})}
	p.Server = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.Close)
	t.Cleanup(func() { close(p.closing) }) // first: Close waits for hung calls
	return p
}

// Fail makes the next calls to endpoint answer faults, one call each, in
// order; the calls after them are served.
func (p *Provider) Fail(endpoint string, faults ...Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults[endpoint] = append(p.faults[endpoint], faults...)
}

// SetLatency makes every call served from now on take d before it answers,
// as a real provider's calls take time: calls made at once overlap.
func (p *Provider) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// Arrivals are the times the calls arrived (the provider's clock), in
// order, faults included: what a provider's own rate limit counts.
func (p *Provider) Arrivals() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.arrived)
}

// MaxConcurrent is the most calls the provider was serving at once.
func (p *Provider) MaxConcurrent() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.most
}

// MaxIn is the most calls that arrived within any window of length w: the
// count a provider limiting calls per w would compare with its limit.
func (p *Provider) MaxIn(w time.Duration) int {
	at := p.Arrivals()
	most, first := 0, 0
	for i, t := range at {
		for t.Sub(at[first]) >= w {
			first++
		}
		most = max(most, i-first+1)
	}
	return most
}

func (p *Provider) serve(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.arrived = append(p.arrived, time.Now())
	p.running++
	p.most = max(p.most, p.running)
	latency := p.latency
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.running--
		p.mu.Unlock()
	}()
	if latency > 0 {
		time.Sleep(latency)
	}
	endpoint := strings.TrimPrefix(r.URL.Path, "/")
	key := r.Header.Get(foreign.Header)
	if key == "" || r.Method != http.MethodPost || len(endpoint) < 2 {
		http.Error(w, "POST /{endpoint} with an Idempotency-Key", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.keys[endpoint] = append(p.keys[endpoint], key)
	p.traces[endpoint] = append(p.traces[endpoint], r.Header.Get("traceparent"))
	var fault Fault
	if f := p.faults[endpoint]; len(f) > 0 {
		fault, p.faults[endpoint] = f[0], f[1:]
	}
	if fault.Status != 0 {
		p.mu.Unlock()
		maps.Copy(w.Header(), fault.Header)
		http.Error(w, "fault", fault.Status)
		return
	}
	made := p.effects[endpoint]
	if made == nil {
		made = map[string]string{}
		p.effects[endpoint] = made
	}
	id, seen := made[key]
	if !seen {
		id = fmt.Sprintf("%s_%d", endpoint[:2], len(made)+1)
		made[key] = id
		if of := r.URL.Query().Get("of"); of != "" {
			if p.undoes[endpoint] == nil {
				p.undoes[endpoint] = map[string]string{}
			}
			p.undoes[endpoint][key] = of
		}
	}
	p.mu.Unlock()
	if fault.Hang {
		select {
		case <-r.Context().Done():
		case <-p.closing:
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"id": id})
}

// Effects is how many effects endpoint made: one per key.
func (p *Provider) Effects(endpoint string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.effects[endpoint])
}

// Made reports whether endpoint made an effect for key.
func (p *Provider) Made(endpoint, key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.effects[endpoint][key]
	return ok
}

// Undoes maps each key endpoint made an effect for to the key its call
// named as the one it undoes (Refund's charge key); a key whose call named
// none maps to "".
func (p *Provider) Undoes(endpoint string) map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	undoes := map[string]string{}
	for key := range p.effects[endpoint] {
		undoes[key] = p.undoes[endpoint][key]
	}
	return undoes
}

// Keys are the keys endpoint was called with, in call order, repeats
// included.
func (p *Provider) Keys(endpoint string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.keys[endpoint]...)
}

// TraceParents are the traceparent headers of endpoint's calls, in call
// order ("" for a call without one).
func (p *Provider) TraceParents(endpoint string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.traces[endpoint]...)
}

// MaxCalls is the most calls endpoint got with one key.
func (p *Provider) MaxCalls(endpoint string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	calls := map[string]int{}
	most := 0
	for _, k := range p.keys[endpoint] {
		calls[k]++
		most = max(most, calls[k])
	}
	return most
}

// Refund is the checkout charge's compensation, for foreign.Compensate:
// it refunds the charge c.Compensates names, with c.Key, its own derived
// key, at the Provider at providerURL.
func Refund(providerURL string) func(ctx context.Context, c *foreign.Call[Order, State]) error {
	return func(ctx context.Context, c *foreign.Call[Order, State]) error {
		_, err := CallUndoing(ctx, providerURL, "refunds", c.Key, c.Compensates)
		return err
	}
}

// Call posts to endpoint of the Provider at providerURL with key and
// returns the id it answers. A status other than 2xx is classified by
// foreign.CheckResponse.
func Call(ctx context.Context, providerURL, endpoint, key string) (string, error) {
	return CallUndoing(ctx, providerURL, endpoint, key, "")
}

// CallUndoing is Call for a call that undoes the effect made with the key
// of (a refund of a charge): the Provider remembers it (Provider.Undoes).
// An empty of names none.
func CallUndoing(ctx context.Context, providerURL, endpoint, key, of string) (string, error) {
	target := providerURL + "/" + endpoint
	if of != "" {
		target += "?" + url.Values{"of": {of}}.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, nil)
	if err != nil {
		return "", err
	}
	foreign.SetHeader(req, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if err := foreign.CheckResponse(resp); err != nil {
		return "", fmt.Errorf("%s: %w", endpoint, err)
	}
	var out struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", err
	}
	return out.ID, nil
}
