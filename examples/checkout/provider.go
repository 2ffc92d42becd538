package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
}

// provider is a fake payment provider that deduplicates by Idempotency-Key,
// as real ones do: the same key again answers the same way, the same key
// with another body is 422, and tok_decline is declined (402).
type provider struct {
	mu       sync.Mutex
	byKey    map[string]providerAnswer
	charges  []Charge
	requests int
}

type providerAnswer struct {
	fingerprint string
	status      int
	body        []byte
}

func newProvider() *provider { return &provider{byKey: map[string]providerAnswer{}} }

func (p *provider) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", p.charge)
	mux.HandleFunc("GET /charges", p.list)
	return mux
}

func (p *provider) charge(w http.ResponseWriter, r *http.Request) {
	key := strings.Trim(r.Header.Get(foreign.Header), `"`)
	var req ChargeRequest
	buf := new(bytes.Buffer)
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, 1<<16)); err != nil || json.Unmarshal(buf.Bytes(), &req) != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid charge request"})
		return
	}
	if key == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "an Idempotency-Key is required"})
		return
	}
	sum := sha256.Sum256(fmt.Appendf(nil, "%d|%s|%s", req.AmountCents, req.Currency, req.CardToken))
	fingerprint := hex.EncodeToString(sum[:])

	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests++
	if prior, ok := p.byKey[key]; ok {
		if prior.fingerprint != fingerprint {
			writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"error": "Idempotency-Key reused with another request"})
			return
		}
		writeBody(w, prior.status, prior.body)
		return
	}
	answer := providerAnswer{fingerprint: fingerprint}
	if req.CardToken == "tok_decline" {
		answer.status = http.StatusPaymentRequired
		answer.body, _ = json.Marshal(map[string]string{"error": "card_declined"})
	} else {
		c := Charge{ID: fmt.Sprintf("ch_%06d", len(p.charges)+1), IdempotencyKey: key, AmountCents: req.AmountCents, Currency: req.Currency}
		p.charges = append(p.charges, c)
		answer.status = http.StatusCreated
		answer.body, _ = json.Marshal(Charge{ID: c.ID, AmountCents: c.AmountCents, Currency: c.Currency})
	}
	p.byKey[key] = answer
	writeBody(w, answer.status, answer.body)
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
