// Package outbox delivers side effects that cannot take an idempotency key:
// email, SMS, anything that ends at a human.
//
// [Outbox.Enqueue] writes a message inside a phase's transaction, so it exists
// exactly when the business change does. A [Relay] takes batches of pending
// messages (FOR UPDATE SKIP LOCKED, so several relays share the work),
// hides them for a lease, and hands each to the handler registered for its
// topic. A failed delivery is retried with exponential backoff and jitter;
// after MaxAttempts the message is dead-lettered and kept for inspection. A
// relay that dies mid-batch leaves its messages to be taken again when the
// lease ends: delivery is at least once.
//
// Each message has a stable dedupe key. A consumer makes the effect once
// with [Outbox.Process], which records the key in the consumer's own transaction
// under a primary key, so the database refuses a redelivery however late
// it arrives.
package outbox
