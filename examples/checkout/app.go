package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// CheckoutRequest is what POST /v1/checkouts takes.
type CheckoutRequest struct {
	CustomerID  string `json:"customer_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	CardToken   string `json:"card_token"`
	Items       []Item `json:"items"`
}

// Item is one line of an order.
type Item struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

var currencies = map[string]bool{"usd": true, "eur": true, "gbp": true}

// Limits of a checkout request.
const (
	maxAmountCents = 1_000_000_000 // ten million in the currency's unit
	maxItems       = 100
	maxText        = 255 // bytes of any string
)

// Validate refuses a request before any record is made (422).
func (r CheckoutRequest) Validate() error {
	var problems []string
	if strings.TrimSpace(r.CustomerID) == "" {
		problems = append(problems, "customer_id is required")
	}
	if r.AmountCents <= 0 || r.AmountCents > maxAmountCents {
		problems = append(problems, fmt.Sprintf("amount_cents must be between 1 and %d", maxAmountCents))
	}
	if !currencies[r.Currency] {
		problems = append(problems, fmt.Sprintf("currency %q is not one of usd, eur, gbp", r.Currency))
	}
	if !strings.HasPrefix(r.CardToken, "tok_") {
		problems = append(problems, "card_token must be a tok_ token")
	}
	if len(r.Items) == 0 || len(r.Items) > maxItems {
		problems = append(problems, fmt.Sprintf("items must hold 1 to %d items", maxItems))
	}
	texts := map[string]string{"customer_id": r.CustomerID, "currency": r.Currency, "card_token": r.CardToken}
	for i, it := range r.Items {
		if it.SKU == "" || it.Qty <= 0 {
			problems = append(problems, fmt.Sprintf("items[%d] needs a sku and a positive qty", i))
		}
		texts[fmt.Sprintf("items[%d].sku", i)] = it.SKU
	}
	for _, field := range slices.Sorted(maps.Keys(texts)) {
		if problem := textProblem(texts[field], maxText); problem != "" {
			problems = append(problems, field+" "+problem)
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// textProblem says what is wrong with a string of a request, or "": longer
// than limit bytes, or holding a control character.
func textProblem(s string, limit int) string {
	if len(s) > limit {
		return fmt.Sprintf("is %d bytes, longer than %d", len(s), limit)
	}
	if i := strings.IndexFunc(s, unicode.IsControl); i >= 0 {
		return fmt.Sprintf("holds a control character at byte %d", i)
	}
	return ""
}

// CheckoutState is the workflow's state, committed at every step.
type CheckoutState struct {
	OrderID     string `json:"order_id"`
	ChargeID    string `json:"charge_id,omitempty"`
	Declined    bool   `json:"declined,omitempty"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	// ChargedCents and ChargedCurrency are what the provider answered it
	// charged, which record_charge checks against the order.
	ChargedCents    int64  `json:"charged_cents,omitempty"`
	ChargedCurrency string `json:"charged_currency,omitempty"`
}

// schemaSQL is the checkout's own tables. It runs under an advisory lock so
// that several servers may start at once. The ALTER brings a table made by
// an earlier release up to date: its orders start at version 1, with no
// shipping address. It runs only then: ALTER TABLE waits for every open
// transaction on the table, and holds up every later one, even when it has
// nothing to add. Every write to an order adds one to its version, the
// order's ETag (orders.go).
const schemaSQL = `
SELECT pg_advisory_xact_lock(7245000001);
CREATE TABLE IF NOT EXISTS checkout_orders (
    id           text        PRIMARY KEY,
    tenant_id    text        NOT NULL,
    customer_id  text        NOT NULL,
    amount_cents bigint      NOT NULL,
    currency     text        NOT NULL,
    items        jsonb       NOT NULL,
    status       text        NOT NULL,
    charge_id    text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    version      bigint      NOT NULL DEFAULT 1,
    shipping_address text
);
DO $$
BEGIN
    IF (SELECT count(*) FROM pg_attribute WHERE attrelid = 'checkout_orders'::regclass
            AND attname IN ('version', 'shipping_address') AND NOT attisdropped) < 2 THEN
        ALTER TABLE checkout_orders
            ADD COLUMN IF NOT EXISTS version          bigint NOT NULL DEFAULT 1,
            ADD COLUMN IF NOT EXISTS shipping_address text;
    END IF;
END $$;
CREATE TABLE IF NOT EXISTS checkout_receipts (
    order_id text        PRIMARY KEY REFERENCES checkout_orders (id),
    sent_at  timestamptz NOT NULL DEFAULT now()
);`

// app is the checkout service: its workflow, its HTTP routes, and the
// consumer that sends receipts.
type app struct {
	db       *pgxpool.Pool
	outbox   *outbox.Outbox
	provider string // the payment provider's base URL
	client   *http.Client
	logger   *slog.Logger
}

// checkout declares create_order → charge → record_charge. A checkout that
// fails for good before record_charge has committed (record_charge aborts
// on a charge that does not match the order) refunds its charge; once
// record_charge has committed, the order is paid and nothing is undone.
func (a *app) checkout() *workflow.Workflow[CheckoutRequest, CheckoutState] {
	return workflow.Define("checkout",
		phase.Atomic("create_order", a.createOrder),
		foreign.Mutation("charge", a.charge, foreign.Compensate(a.refund)),
		phase.Atomic("record_charge", a.recordCharge),
	).PointOfNoReturn("record_charge").Finish(paidResponse)
}

// paidResponse is the checkout's answer once the order is paid.
func paidResponse(s *CheckoutState) workflow.Response {
	return workflow.JSON(http.StatusCreated, map[string]any{
		"order_id": s.OrderID, "charge_id": s.ChargeID, "status": "paid",
		"amount_cents": s.AmountCents, "currency": s.Currency,
	})
}

func (a *app) createOrder(ctx context.Context, tx pgx.Tx, r *phase.Run[CheckoutRequest, CheckoutState]) error {
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	r.State.OrderID = "ord_" + hex.EncodeToString(id)
	r.State.AmountCents, r.State.Currency = r.Request.AmountCents, r.Request.Currency
	items, err := json.Marshal(r.Request.Items)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO checkout_orders (id, tenant_id, customer_id, amount_cents, currency, items, status)
		VALUES ($1, $2, $3, $4, $5, $6, 'pending')`,
		r.State.OrderID, r.Key.Tenant, r.Request.CustomerID, r.Request.AmountCents, r.Request.Currency, items)
	return err
}

// post sends body as JSON to the provider's path, with key as its
// Idempotency-Key.
func (a *app) post(ctx context.Context, path, key string, body any) (*http.Response, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.provider+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	foreign.SetHeader(req, key)
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("payment provider: %w", err)
	}
	return resp, nil
}

// charge asks the provider for the money, with the derived key as its
// Idempotency-Key: a retry of this step is the same charge.
func (a *app) charge(ctx context.Context, c *foreign.Call[CheckoutRequest, CheckoutState]) error {
	resp, err := a.post(ctx, "/charges", c.Key,
		ChargeRequest{AmountCents: c.Request.AmountCents, Currency: c.Request.Currency, CardToken: c.Request.CardToken})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusCreated:
		var ch Charge
		if err := json.NewDecoder(resp.Body).Decode(&ch); err != nil {
			return fmt.Errorf("payment provider answer: %w", err)
		}
		c.State.ChargeID, c.State.ChargedCents, c.State.ChargedCurrency = ch.ID, ch.AmountCents, ch.Currency
		return nil
	case http.StatusPaymentRequired:
		c.State.Declined = true // recorded by the next phase, which answers 402
		return nil
	default:
		return fmt.Errorf("payment provider answered %s", resp.Status)
	}
}

// refund is charge's compensation: it refunds the charge made with the
// step's key (c.Compensates) under a key of its own (c.Key). A charge the
// provider never made (the charge was lost on its way, or declined) is
// nothing to undo, and neither is one refunded already: the provider
// answers 404 (and refuses that charge if it arrives later) or 409.
func (a *app) refund(ctx context.Context, c *foreign.Call[CheckoutRequest, CheckoutState]) error {
	resp, err := a.post(ctx, "/refunds", c.Key, RefundRequest{ChargeKey: c.Compensates})
	if err != nil {
		return refundLater(c.Attempt, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusConflict {
		return nil
	}
	if err := foreign.CheckResponse(resp); err != nil {
		if phase.IsPermanent(err) {
			return fmt.Errorf("payment provider refund: %w", err)
		}
		return refundLater(c.Attempt, fmt.Errorf("payment provider refund: %w", err))
	}
	return nil
}

// refundBackoffBase and refundBackoffCap pace the attempts at a refund
// that failed transiently: base·2^(attempt-1), at most the cap.
const (
	refundBackoffBase = time.Second
	refundBackoffCap  = 5 * time.Minute
)

// refundLater defers a refund that failed transiently (a timeout, a 5xx)
// rather than failing the attempt: a compensation has MaxAttempts attempts
// and then fails for good, leaving the charge unrefunded and the stored 502
// replaced by a 500. A client retrying at once, or the sweeper, would spend
// those attempts within a second of a provider's hiccup; deferred, the key
// is not claimed again before the backoff, so the attempts span minutes
// (longer when the provider asks for more with Retry-After).
func refundLater(attempt int, err error) error {
	wait := refundBackoffCap
	if attempt >= 1 && attempt <= 20 {
		wait = min(refundBackoffBase<<(attempt-1), refundBackoffCap)
	}
	if asked := (*foreign.HTTPError)(nil); errors.As(err, &asked) {
		wait = max(wait, asked.RetryAfter) // the provider said when to come back
	}
	return phase.Defer(wait, err)
}

func (a *app) recordCharge(ctx context.Context, tx pgx.Tx, r *phase.Run[CheckoutRequest, CheckoutState]) error {
	if s := &r.State; s.ChargedCurrency != "" && (s.ChargedCents != s.AmountCents || s.ChargedCurrency != s.Currency) {
		// (A state committed by a release that did not keep the charged
		// amount has no ChargedCurrency: its charge is taken as it is.)
		return cancelMischarged(ctx, tx, s)
	}
	if r.State.Declined {
		if _, err := tx.Exec(ctx, `UPDATE checkout_orders SET status = 'declined', version = version + 1 WHERE id = $1`, r.State.OrderID); err != nil {
			return err
		}
		resp := workflow.Problem(http.StatusPaymentRequired, "the card was declined; order "+r.State.OrderID+" is not paid")
		return workflow.Respond(resp)
	}
	if _, err := tx.Exec(ctx, `UPDATE checkout_orders SET status = 'paid', charge_id = $2, version = version + 1 WHERE id = $1`,
		r.State.OrderID, r.State.ChargeID); err != nil {
		return err
	}
	return a.outbox.Enqueue(ctx, tx, outbox.Message{
		Topic: "receipt", DedupeKey: "receipt:" + r.State.OrderID,
		Payload: map[string]any{"order_id": r.State.OrderID, "customer_id": r.Request.CustomerID,
			"amount_cents": r.State.AmountCents, "currency": r.State.Currency},
	})
}

// cancelMischarged cancels an order the provider charged another amount
// for, and aborts the checkout: the engine refunds the charge (refund),
// then answers the stored 502.
func cancelMischarged(ctx context.Context, tx pgx.Tx, s *CheckoutState) error {
	if _, err := tx.Exec(ctx, `UPDATE checkout_orders SET status = 'cancelled', charge_id = $2, version = version + 1 WHERE id = $1`,
		s.OrderID, s.ChargeID); err != nil {
		return err
	}
	return workflow.Abort(workflow.Problem(http.StatusBadGateway, fmt.Sprintf(
		"the payment provider charged %d %s for order %s of %d %s; the charge is refunded and the order is cancelled",
		s.ChargedCents, s.ChargedCurrency, s.OrderID, s.AmountCents, s.Currency)))
}

// sendReceipt is the outbox consumer: it records the receipt in the same
// transaction as the processed key, so a redelivery sends nothing twice.
func (a *app) sendReceipt(ctx context.Context, m *outbox.Record) error {
	var receipt struct {
		OrderID    string `json:"order_id"`
		CustomerID string `json:"customer_id"`
	}
	if err := json.Unmarshal(m.Payload, &receipt); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, a.db, func(tx pgx.Tx) error {
		sent, err := a.outbox.Process(ctx, tx, "receipts", m.DedupeKey, func() error {
			if _, err := tx.Exec(ctx, `INSERT INTO checkout_receipts (order_id) VALUES ($1)`, receipt.OrderID); err != nil {
				return err
			}
			// The order shows receipt_sent: a new version, a new ETag.
			_, err := tx.Exec(ctx, `UPDATE checkout_orders SET version = version + 1 WHERE id = $1`, receipt.OrderID)
			return err
		})
		if sent {
			a.logger.Info("receipt email sent", slog.String("order", receipt.OrderID), slog.String("customer", receipt.CustomerID))
		}
		return err
	})
}

// getOrder serves GET /v1/orders/{order_id}, for the order's tenant only,
// with the order's ETag; a matching If-None-Match is 304.
func (a *app) getOrder(w http.ResponseWriter, r *http.Request) {
	tenant, err := authenticatedTenant(r)
	if err != nil {
		writeProblem(w, workflow.Problem(http.StatusUnauthorized, err.Error()))
		return
	}
	id, ok := orderID(r)
	if !ok {
		writeProblem(w, workflow.Problem(http.StatusNotFound, "no such order"))
		return
	}
	o, err := readOrder(r.Context(), a.db, tenant, id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		writeProblem(w, workflow.Problem(http.StatusNotFound, "no such order"))
	case err != nil:
		a.logger.Error("read order", slog.Any("error", err))
		writeProblem(w, workflow.Problem(http.StatusServiceUnavailable, "the order could not be read"))
	default:
		w.Header().Set("ETag", idemhttp.ETag(o.version))
		if !idemhttp.WritePrecondition(w, idemhttp.CheckPreconditions(r, idemhttp.ETag(o.version), false)) {
			writeJSON(w, http.StatusOK, o)
		}
	}
}

func writeProblem(w http.ResponseWriter, resp workflow.Response) {
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}
