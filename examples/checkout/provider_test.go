package main

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestProviderRefunds: POST /refunds refunds a charge named by its key,
// once, deduplicated by its own key; a refund of a charge never made is 404
// and bars the charge's key, so that a charge arriving after its refund is
// refused; GET /charges shows each charge's refund.
func TestProviderRefunds(t *testing.T) {
	e := newEnv(t)
	post := func(path, key, body string) call {
		t.Helper()
		return e.do(http.MethodPost, e.provider+path, key, "", body)
	}
	refundOf := func(chargeKey string) string { return `{"charge_idempotency_key":"` + chargeKey + `"}` }

	require.Equal(t, http.StatusCreated, post("/charges", "pk-1", `{"amount_cents":100,"currency":"usd","card_token":"tok_visa"}`).status)
	first := post("/refunds", "rk-1", refundOf("pk-1"))
	require.Equal(t, http.StatusCreated, first.status, first.body)
	require.Regexp(t, `^\{"id":"re_\d+","charge_id":"ch_\d+","amount_cents":100,"currency":"usd"\}$`, first.body)
	again := post("/refunds", "rk-1", refundOf("pk-1"))
	require.Equal(t, []any{first.status, first.body}, []any{again.status, again.body}, "the same key, the same refund")
	require.Equal(t, http.StatusUnprocessableEntity, post("/refunds", "rk-1", refundOf("pk-2")).status)
	require.Equal(t, http.StatusConflict, post("/refunds", "rk-2", refundOf("pk-1")).status, "a charge is refunded once")

	// A charge that timed out at the client and is refunded before it
	// arrives: nothing to refund, and the late charge is refused.
	never := post("/refunds", "rk-3", refundOf("pk-late"))
	require.Equal(t, http.StatusNotFound, never.status, never.body)
	require.Equal(t, http.StatusConflict, post("/charges", "pk-late", `{"amount_cents":100,"currency":"usd","card_token":"tok_visa"}`).status)
	again = post("/refunds", "rk-3", refundOf("pk-late"))
	require.Equal(t, []any{never.status, never.body}, []any{again.status, again.body})

	// A declined charge has nothing to refund, and stays declined.
	declined := `{"amount_cents":100,"currency":"usd","card_token":"tok_decline"}`
	require.Equal(t, http.StatusPaymentRequired, post("/charges", "pk-3", declined).status)
	require.Equal(t, http.StatusNotFound, post("/refunds", "rk-4", refundOf("pk-3")).status)
	require.Equal(t, http.StatusPaymentRequired, post("/charges", "pk-3", declined).status)

	wrong := post("/charges", "pk-4", `{"amount_cents":100,"currency":"usd","card_token":"`+tokWrongAmount+`"}`)
	require.Equal(t, http.StatusCreated, wrong.status)
	require.Contains(t, wrong.body, `"amount_cents":101`, tokWrongAmount+" charges a cent more")

	require.Equal(t, http.StatusBadRequest, post("/refunds", "", refundOf("pk-1")).status)
	require.Equal(t, http.StatusBadRequest, post("/refunds", "rk-5", `{}`).status)

	charges := e.charges()
	require.Len(t, charges, 2)
	require.Equal(t, "pk-1", charges[0].IdempotencyKey)
	require.NotNil(t, charges[0].Refund)
	require.Equal(t, Refund{ID: charges[0].Refund.ID, IdempotencyKey: "rk-1", ChargeID: charges[0].ID, AmountCents: 100, Currency: "usd"},
		*charges[0].Refund)
	require.Nil(t, charges[1].Refund)
}
