package recovery

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxKeyLength is the longest tenant, key or operation name, in bytes.
const MaxKeyLength = 255

// Key identifies one intent: an idempotency key within a tenant. Keys are
// scoped per tenant; the same ID under two tenants is two independent
// records.
type Key struct {
	Tenant string
	ID     string
}

// Validate checks the input rules: tenant and ID are required, at most
// MaxKeyLength bytes, valid UTF-8 and printable. It returns an *InputError.
func (k Key) Validate() error {
	if err := checkName("tenant", k.Tenant); err != nil {
		return err
	}
	return checkName("key", k.ID)
}

// CheckName applies the input rules of keys to another name (a workflow,
// a step): required, at most MaxKeyLength bytes, valid UTF-8, printable. It
// returns an *InputError that names field.
func CheckName(field, value string) error { return checkName(field, value) }

// checkName applies the input rules to one named value.
func checkName(field, value string) error {
	if value == "" {
		return &InputError{Field: field, Problem: "is required"}
	}
	if len(value) > MaxKeyLength {
		return &InputError{Field: field, Problem: fmt.Sprintf("is %d bytes, longer than %d", len(value), MaxKeyLength)}
	}
	for i, r := range value {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(value[i:]); size == 1 {
				return &InputError{Field: field, Problem: fmt.Sprintf("is not valid UTF-8 (byte %d)", i)}
			}
		}
		if !unicode.IsPrint(r) {
			return &InputError{Field: field, Problem: fmt.Sprintf("contains the non-printable character %U at byte %d", r, i)}
		}
	}
	return nil
}
