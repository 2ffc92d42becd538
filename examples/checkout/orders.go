package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// An order's ETag is its version column (idemhttp.ETag): every write to the
// order adds one to it. PATCH /v1/orders/{order_id} changes the shipping
// address under If-Match, which makes it naturally idempotent: a retry, or
// a concurrent client's PATCH, names a version that is gone and gets 412.
// So it is not behind the Idempotency-Key layer.

// orderView is an order as GET and PATCH /v1/orders/{order_id} show it.
type orderView struct {
	OrderID         string  `json:"order_id"`
	CustomerID      string  `json:"customer_id"`
	Status          string  `json:"status"`
	ChargeID        *string `json:"charge_id"`
	AmountCents     int64   `json:"amount_cents"`
	Currency        string  `json:"currency"`
	ShippingAddress *string `json:"shipping_address"`
	ReceiptSent     bool    `json:"receipt_sent"`
	version         int64
}

// readOrder reads the order id of tenant; pgx.ErrNoRows when tenant has
// no such order.
func readOrder(ctx context.Context, db recovery.DBTX, tenant, id string) (orderView, error) {
	var o orderView
	err := db.QueryRow(ctx, `
		SELECT o.id, o.customer_id, o.status, o.charge_id, o.amount_cents, o.currency, o.shipping_address,
			r.order_id IS NOT NULL, o.version
		FROM checkout_orders o LEFT JOIN checkout_receipts r ON r.order_id = o.id
		WHERE o.id = $1 AND o.tenant_id = $2`, id, tenant).
		Scan(&o.OrderID, &o.CustomerID, &o.Status, &o.ChargeID, &o.AmountCents, &o.Currency, &o.ShippingAddress,
			&o.ReceiptSent, &o.version)
	return o, err
}

// orderID is the request's order id; false for one no text column holds,
// which no order has.
func orderID(r *http.Request) (string, bool) {
	id := r.PathValue("order_id")
	return id, utf8.ValidString(id) && !strings.ContainsRune(id, 0)
}

// addressMayChange are the statuses of an order whose shipping address may
// change: it may still ship. A declined or cancelled order never will.
var addressMayChange = map[string]bool{"pending": true, "paid": true}

// errOrderClosed reports an order whose address may no longer change: 409.
var errOrderClosed = errors.New("order closed")

// patchOrder serves PATCH /v1/orders/{order_id}: it sets the shipping
// address of the tenant's order, if the order is still at the version
// If-Match names and may still ship, and answers the order and its new
// ETag.
func (a *app) patchOrder(w http.ResponseWriter, r *http.Request) {
	tenant, err := authenticatedTenant(r)
	if err != nil {
		writeProblem(w, workflow.Problem(http.StatusUnauthorized, err.Error()))
		return
	}
	if ifMatch := r.Header.Values("If-Match"); ifMatch == nil || namesAnyVersion(ifMatch) {
		idemhttp.WritePrecondition(w, idemhttp.ErrPreconditionRequired)
		return
	}
	address, problem := readAddress(w, r)
	if problem != nil {
		writeProblem(w, *problem)
		return
	}
	id, ok := orderID(r)
	if !ok {
		writeProblem(w, workflow.Problem(http.StatusNotFound, "no such order"))
		return
	}
	var updated orderView
	err = pgx.BeginFunc(r.Context(), a.db, func(tx pgx.Tx) error {
		updated, err = setAddress(r, tx, tenant, id, address)
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.Is(err, idemhttp.ErrNotFound):
		writeProblem(w, workflow.Problem(http.StatusNotFound, "no such order"))
	case errors.Is(err, errOrderClosed):
		writeProblem(w, workflow.Problem(http.StatusConflict, fmt.Sprintf(
			"the order is %s: it will not ship, and its shipping address can no longer change", updated.Status)))
	case idemhttp.WritePrecondition(w, err):
	case err != nil:
		a.logger.Error("update order", slog.Any("error", err))
		writeProblem(w, workflow.Problem(http.StatusServiceUnavailable, "the order could not be updated"))
	default:
		w.Header().Set("ETag", idemhttp.ETag(updated.version))
		writeJSON(w, http.StatusOK, updated)
	}
}

// namesAnyVersion reports whether the If-Match values are "*", which
// matches every version of an existing order: a PATCH under it would
// overwrite what it did not see, and its retry would apply again, so the
// route takes it as no If-Match at all (428).
func namesAnyVersion(ifMatch []string) bool {
	return strings.Trim(strings.Join(ifMatch, ","), " \t") == "*"
}

// setAddress sets the shipping address of tenant's order id in tx, if r's
// preconditions hold for the order as it is and it may still ship, and
// returns the order updated (the order as it was with errOrderClosed). The
// update is a compare-and-set on the version read, so the checks hold for
// the row it writes: a writer that changed the order since (the checkout
// that declines it, a concurrent PATCH) changed its version, and this
// update is then ErrVersionMismatch, 412.
func setAddress(r *http.Request, tx pgx.Tx, tenant, id, address string) (orderView, error) {
	ctx := r.Context()
	current, err := readOrder(ctx, tx, tenant, id)
	if err != nil {
		return orderView{}, err
	}
	if err := idemhttp.CheckPreconditions(r, idemhttp.ETag(current.version), true); err != nil {
		return orderView{}, err
	}
	if !addressMayChange[current.Status] {
		return current, errOrderClosed
	}
	if _, err := idemhttp.VersionedUpdate(ctx, tx, "checkout_orders", id, current.version,
		map[string]any{"shipping_address": address}); err != nil {
		return orderView{}, err
	}
	return readOrder(ctx, tx, tenant, id)
}

// Limits of a PATCH /v1/orders/{order_id}.
const (
	maxPatchBody = 4 << 10 // bytes
	maxAddress   = 500     // bytes of shipping_address
)

// readAddress reads the body of a PATCH, {"shipping_address": "..."}, and
// returns the address, or the problem that answers the request: 413 for a
// body over maxPatchBody, 415 for a media type other than JSON, 400 for a
// body that is not that one object of exact field names, and 422 for an
// address that is blank, over maxAddress bytes or holds a control
// character.
func readAddress(w http.ResponseWriter, r *http.Request) (string, *workflow.Response) {
	fail := func(status int, detail string) (string, *workflow.Response) {
		p := workflow.Problem(status, detail)
		return "", &p
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil ||
		mt != "application/json" && mt != "application/merge-patch+json" {
		return fail(http.StatusUnsupportedMediaType, "send the body as application/json")
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPatchBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return fail(http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", maxPatchBody))
	case err != nil:
		return fail(http.StatusBadRequest, "could not read the body")
	case !utf8.Valid(body):
		return fail(http.StatusBadRequest, "the body is not UTF-8")
	}
	address, err := decodeAddress(body)
	if err != nil {
		return fail(http.StatusBadRequest, err.Error())
	}
	switch {
	case address == nil:
		return fail(http.StatusUnprocessableEntity, "shipping_address is required")
	case strings.TrimSpace(*address) == "":
		return fail(http.StatusUnprocessableEntity, "shipping_address is blank")
	}
	if problem := textProblem(*address, maxAddress); problem != "" {
		return fail(http.StatusUnprocessableEntity, "shipping_address "+problem)
	}
	return *address, nil
}

// decodeAddress decodes body, one JSON object whose only field, once, is
// shipping_address, a string; nil when the object is empty.
func decodeAddress(body []byte) (*string, error) {
	const want = `the body must be {"shipping_address": "..."}`
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New(want)
	}
	var address *string
	for dec.More() {
		key, err := dec.Token()
		if err != nil || key != "shipping_address" || address != nil {
			return nil, errors.New(want + ": one field, named exactly so")
		}
		value, err := dec.Token()
		s, ok := value.(string)
		if err != nil || !ok {
			return nil, errors.New("shipping_address must be a string")
		}
		address = &s
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, errors.New(want)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New(want + ", with nothing after it")
	}
	return address, nil
}
