package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/onceflow/onceflow/foreign"
)

// ChargeRequest is what the provider charges.
type ChargeRequest struct {
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	CardToken   string `json:"card_token"`
}

// Charge is a charge the provider made.
type Charge struct {
	ID             string `json:"id"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	AmountCents    int64  `json:"amount_cents"`
	Currency       string `json:"currency"`
	// Refund is the charge's refund, once it is refunded.
	Refund *Refund `json:"refund,omitempty"`
}

// RefundRequest is what the provider refunds: the charge made with the
// Idempotency-Key ChargeKey, in full. A charge is named by its key, not its
// id, so that a charge whose answer never came back can be refunded too.
type RefundRequest struct {
	ChargeKey string `json:"charge_idempotency_key"`
}

// Refund is a refund the provider made.
type Refund struct {
	ID             string `json:"id"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	ChargeID       string `json:"charge_id"`
	AmountCents    int64  `json:"amount_cents"`
	Currency       string `json:"currency"`
}

// Test card tokens: the provider declines tokDecline (402), and charges
// tokWrongAmount one cent more than asked, a provider's mistake the
// checkout must catch.
const (
	tokDecline     = "tok_decline"
	tokWrongAmount = "tok_wrong_amount"
)

// provider is a fake payment provider that deduplicates by Idempotency-Key,
// as real ones do: the same key again answers the same way, the same key
// with another body is 422, and tok_decline is declined (402). It refunds a
// charge once, in full; a refund of a charge it never made answers 404 and
// bars that charge's key, so that a charge arriving after its refund (it
// timed out at the client, and the client gave up on it) is refused (409).
type provider struct {
	mu        sync.Mutex
	byKey     map[string]providerAnswer // charges' answers
	refundKey map[string]providerAnswer // refunds' answers
	barred    map[string]bool           // charge keys refunded before any charge
	charges   []Charge
	refunds   int
	requests  int
}

type providerAnswer struct {
	fingerprint string
	status      int
	body        []byte
}

func newProvider() *provider {
	return &provider{byKey: map[string]providerAnswer{}, refundKey: map[string]providerAnswer{}, barred: map[string]bool{}}
}

func (p *provider) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", p.charge)
	mux.HandleFunc("GET /charges", p.list)
	mux.HandleFunc("POST /refunds", p.refund)
	return mux
}

func (p *provider) charge(w http.ResponseWriter, r *http.Request) {
	var req ChargeRequest
	// A closure, not the method value req.validate, which would copy req
	// before readProviderRequest decodes into it.
	key, ok := readProviderRequest(w, r, &req, "invalid charge request", func() error { return req.validate() }) //nolint:gocritic // see above

	if !ok {
		return
	}
	fingerprint := req.fingerprint()

	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests++
	if replayed(w, p.byKey, key, fingerprint) {
		return
	}
	if p.barred[key] {
		writeJSON(w, http.StatusConflict, map[string]string{"error": "charge_refunded_before_it_arrived"})
		return
	}
	answer := providerAnswer{fingerprint: fingerprint}
	if req.CardToken == tokDecline {
		answer.status = http.StatusPaymentRequired
		answer.body, _ = json.Marshal(map[string]string{"error": "card_declined"})
	} else {
		amount := req.AmountCents
		if req.CardToken == tokWrongAmount {
			amount++
		}
		c := Charge{ID: fmt.Sprintf("ch_%06d", len(p.charges)+1), IdempotencyKey: key, AmountCents: amount, Currency: req.Currency}
		p.charges = append(p.charges, c)
		answer.status = http.StatusCreated
		answer.body, _ = json.Marshal(Charge{ID: c.ID, AmountCents: c.AmountCents, Currency: c.Currency})
	}
	p.byKey[key] = answer
	writeBody(w, answer.status, answer.body)
}

// refund refunds the charge the request names, once: 201 with the refund;
// 409 when the charge was refunded already (under another key); 404 when
// the provider made no charge with that key, which then bars it.
func (p *provider) refund(w http.ResponseWriter, r *http.Request) {
	var req RefundRequest
	key, ok := readProviderRequest(w, r, &req, "invalid refund request", func() error {
		if req.ChargeKey == "" {
			return errors.New("charge_idempotency_key is required")
		}
		return nil
	})
	if !ok {
		return
	}
	fingerprint := fingerprintOf(req)

	p.mu.Lock()
	defer p.mu.Unlock()
	if replayed(w, p.refundKey, key, fingerprint) {
		return
	}
	answer := p.refundLocked(key, req.ChargeKey)
	answer.fingerprint = fingerprint
	p.refundKey[key] = answer
	writeBody(w, answer.status, answer.body)
}

// refundLocked refunds the charge made with chargeKey under the refund key
// key, p.mu held.
func (p *provider) refundLocked(key, chargeKey string) providerAnswer {
	i := slices.IndexFunc(p.charges, func(c Charge) bool { return c.IdempotencyKey == chargeKey })
	switch {
	case i < 0:
		if _, answered := p.byKey[chargeKey]; !answered {
			p.barred[chargeKey] = true // a charge arriving later would be one nobody can refund
		}
		body, _ := json.Marshal(map[string]string{"error": "no_such_charge"})
		return providerAnswer{status: http.StatusNotFound, body: body}
	case p.charges[i].Refund != nil:
		body, _ := json.Marshal(map[string]string{"error": "charge_already_refunded", "refund_id": p.charges[i].Refund.ID})
		return providerAnswer{status: http.StatusConflict, body: body}
	}
	p.refunds++
	c := &p.charges[i]
	c.Refund = &Refund{ID: fmt.Sprintf("re_%06d", p.refunds), IdempotencyKey: key, ChargeID: c.ID, AmountCents: c.AmountCents, Currency: c.Currency}
	body, _ := json.Marshal(Refund{ID: c.Refund.ID, ChargeID: c.ID, AmountCents: c.AmountCents, Currency: c.Currency})
	return providerAnswer{status: http.StatusCreated, body: body}
}

// readProviderRequest reads a request's JSON body into v and its
// Idempotency-Key, and checks v with validate; on a problem it answers 400
// (invalid, when the body is not v's JSON) and returns false.
func readProviderRequest(w http.ResponseWriter, r *http.Request, v any, invalid string, validate func() error) (string, bool) {
	buf := new(bytes.Buffer)
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, 1<<16)); err != nil || json.Unmarshal(buf.Bytes(), v) != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": invalid})
		return "", false
	}
	key, err := providerKey(r.Header.Values(foreign.Header))
	if err == nil {
		err = validate()
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return "", false
	}
	return key, true
}

// replayed answers a request whose key answered before, from answers: the
// same answer, or 422 when the key came with another request. It reports
// whether it answered.
func replayed(w http.ResponseWriter, answers map[string]providerAnswer, key, fingerprint string) bool {
	prior, ok := answers[key]
	switch {
	case !ok:
		return false
	case prior.fingerprint != fingerprint:
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"error": "Idempotency-Key reused with another request"})
	default:
		writeBody(w, prior.status, prior.body)
	}
	return true
}

// fingerprint identifies the charge request (fingerprintOf).
func (r ChargeRequest) fingerprint() string { return fingerprintOf(r) }

// fingerprintOf identifies a request: it hashes the request as JSON, which
// no two requests share ("%d|%s|%s" let a currency holding "|" match
// another request).
func fingerprintOf(req any) string {
	canonical, _ := json.Marshal(req)
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:])
}

// validate refuses what a real provider would: an amount that is not
// positive, an unknown currency, a card token that is not one.
func (r ChargeRequest) validate() error {
	switch {
	case r.AmountCents <= 0:
		return errors.New("amount_cents must be positive")
	case !currencies[r.Currency]:
		return errors.New("unknown currency")
	case !strings.HasPrefix(r.CardToken, "tok_"):
		return errors.New("card_token must be a tok_ token")
	}
	return nil
}

// providerKey reads the Idempotency-Key: one header, holding a bare key of
// visible ASCII without quotes, commas, semicolons or backslashes, or such
// a key between one pair of double quotes. Anything looser (a quote on one
// side only, quotes inside, two keys) is refused: trimming quotes off
// whatever came would make "k" and k"" and ""k"" one key.
func providerKey(values []string) (string, error) {
	if len(values) != 1 {
		return "", errors.New("exactly one Idempotency-Key header is required")
	}
	key := strings.Trim(values[0], " \t")
	if unquoted, ok := strings.CutPrefix(key, `"`); ok {
		if key, ok = strings.CutSuffix(unquoted, `"`); !ok {
			return "", errors.New("the Idempotency-Key has an opening quote and no closing one")
		}
	}
	if key == "" {
		return "", errors.New("the Idempotency-Key is empty")
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= ' ' || c > '~' || strings.IndexByte(`",;\`, c) >= 0 {
			return "", fmt.Errorf("the Idempotency-Key holds %q at byte %d", c, i)
		}
	}
	return key, nil
}

func (p *provider) list(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	charges := slices.Clone(p.charges)
	p.mu.Unlock()
	if charges == nil {
		charges = []Charge{}
	}
	writeJSON(w, http.StatusOK, charges)
}

// counts returns the charges made and the charge requests received.
func (p *provider) counts() (charges, requests int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges), p.requests
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, _ := json.Marshal(v)
	writeBody(w, status, body)
}

func writeBody(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
