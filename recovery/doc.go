// Package recovery keeps the idempotency-key record in PostgreSQL and every
// transition on it.
//
// A Record is one (tenant, key) pair: who holds it (an owner token and a
// lease), how far its work got (a recovery point and state) and, once
// finished, the response to replay. Store.Claim decides in one statement
// what a request carrying the key may do:
//
//	key state              same fingerprint             different fingerprint
//	absent                 OutcomeNew: claim, execute    -
//	in flight, lease valid ErrInFlight (HTTP 409)        ErrMismatch (HTTP 422)
//	in flight, expired     OutcomeTakeover: new owner    ErrMismatch
//	completed or failed    OutcomeReplay: stored reply   ErrMismatch
//
// The owner token is a fence. Every write after the claim (Advance, Complete,
// Fail, Release, Renew, DeleteUnstarted) matches the token; a write that
// matches no row means another attempt took the key over, and it reports
// ErrLeaseLost so the caller rolls back whatever it wrote in the same
// transaction. Lease arithmetic uses the database clock only.
//
// A Fingerprint is a SHA-256 over the operation name and the canonical form
// of the request (see Canonicalize), so an honest retry from a client whose
// JSON encoder orders keys or spaces differently still matches.
//
// Store methods run on whatever executor the Store holds: a pool for
// stand-alone transitions, or a transaction (Store.WithTx) when a transition
// must commit together with the caller's own writes.
package recovery
