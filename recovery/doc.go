// Package recovery keeps the idempotency-key record in PostgreSQL and every
// transition on it.
//
// A [Record] is one (tenant, key) pair: who holds it (an owner token and a
// lease), how far its work got (a recovery point and state) and, once
// finished, the response to replay.
//
// # Claiming a key
//
// [Store.Claim] decides in one statement what a request carrying the key
// may do: a new key is claimed ([OutcomeNew]); a finished one is replayed
// ([OutcomeReplay], the stored response byte for byte); one in flight
// under a valid lease is [ErrInFlight]; one whose lease expired is taken
// over with a new owner token ([OutcomeTakeover]); any of them with a
// different fingerprint is [ErrMismatch], and another principal's is
// [ErrForbidden]. The state machine in full is in docs/state-machine.md
// (https://github.com/onceflow/onceflow/blob/main/docs/state-machine.md).
//
// # Fencing
//
// The owner token is a fence. Every write after the claim ([Store.Advance],
// [Store.Complete], [Store.Fail], [Store.Release], [Store.Renew],
// [Store.DeleteUnstarted]) matches the token; a write that matches no row
// means another attempt took the key over, and it reports [ErrLeaseLost]
// so the caller rolls back whatever it wrote in the same transaction.
// Lease arithmetic uses the database clock only.
//
// # Fingerprints
//
// A [Fingerprint] is a SHA-256 over the operation name and the canonical
// form of the request (see [Canonicalize]), so an honest retry from a
// client whose JSON encoder orders keys or spaces differently still
// matches.
//
// Store methods run on whatever executor the Store holds: a pool for
// stand-alone transitions, or a transaction ([Store.WithTx]) when a
// transition must commit together with the caller's own writes.
package recovery
