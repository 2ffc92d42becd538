package foreign_test

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/recovery"
)

// Every attempt at a step derives the same downstream key, so the other
// system deduplicates a call that runs again after a crash.
func ExampleDeriveKey() {
	key := recovery.Key{Tenant: "acme", ID: "checkout-8c1f"}
	record := uuid.MustParse("0b8e4e0c-7d7b-4a5e-a1c3-1f0c9a7a2d11") // the key record's id

	charge := foreign.DeriveKey(key, record, "charge")
	again := foreign.DeriveKey(key, record, "charge")
	perItem := foreign.DeriveKey(key, record, "reserve_stock", "sku-42")

	fmt.Println(charge == again, strings.HasPrefix(charge, foreign.KeyPrefix), len(charge))
	fmt.Println(perItem != charge)

	req, _ := http.NewRequest(http.MethodPost, "https://payments.example/v1/charges", nil)
	foreign.SetHeader(req, charge)
	fmt.Println(req.Header.Get("Idempotency-Key") == charge)
	// Output:
	// true true 68
	// true
	// true
}
