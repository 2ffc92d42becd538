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
	var req ChargeRequest
	buf := new(bytes.Buffer)
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, 1<<16)); err != nil || json.Unmarshal(buf.Bytes(), &req) != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid charge request"})
		return
	}
	key, err := providerKey(r.Header.Values(foreign.Header))
	if err == nil {
		err = req.validate()
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	fingerprint := req.fingerprint()

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

// fingerprint identifies the request: it hashes the request as JSON, which
// no two requests share ("%d|%s|%s" let a currency holding "|" match
// another request).
func (r ChargeRequest) fingerprint() string {
	canonical, _ := json.Marshal(r)
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
