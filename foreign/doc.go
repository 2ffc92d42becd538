// Package foreign declares calls to other systems inside a workflow and
// gives each a downstream idempotency key.
//
// A foreign mutation ([Mutation]) runs outside any transaction: once a
// payment provider has charged a card, no rollback can take it back. What
// makes it safe to run again after a crash is the key it carries: derived
// deterministically from the key record (its tenant, key and id) and the
// step's name, and hashed, so no request data leaks into another system's
// logs. Every attempt at the same step derives the same key, so the other
// system deduplicates a repeated call and returns its first result. A key
// reused after its record was pruned has a new record id and so derives new
// downstream keys.
//
// Send the key the way the other system expects it; [SetHeader] sets the
// Idempotency-Key header of an HTTP request.
package foreign
