// Package idemclient is the client half of the Idempotency-Key protocol
// that package idemhttp serves: it sends a request under a key and retries
// it, with the same key and the same body, until it gets an answer a retry
// would not change, so that a request is done once however often it is
// sent.
//
// It depends on net/http alone; a client need not know the server is
// built on onceflow, only that it speaks the protocol.
//
// # One key per intent
//
// [Client.Do] is one intent: every attempt carries the same key, the
// request's own Idempotency-Key when it has one, else a new [NewKey]. A
// key that must outlive the process (the request is the consequence of a
// row you stored) belongs in that row: make it with NewKey, store it, and
// set it on the request; a retry after a restart then reuses it, and the
// server answers it from its record ([Response].Replayed).
//
// # What is retried
//
// Transport errors (connection refused, reset or closed early; a timed-out
// attempt) and the answers 409 (the key is in flight), 425, 429, 500, 502,
// 503 and 504 are retried, after a full-jitter exponential backoff, and no
// sooner than the server's Retry-After, unless the server replayed them
// from its record of the key (Idempotent-Replayed: true), which a retry
// would get again. Every other answer, 2xx and 4xx alike, is final and
// returned. A redirect is followed only when it sends the same request
// again (307, 308); any other (a POST's 303 See Other) is the answer. The
// caller's context cancelled ends it.
//
// # Bounds
//
// Retries are bounded per intent (Config.MaxAttempts, Config.MaxElapsed,
// the context's deadline) and for the whole Client, by a retry budget
// ([BudgetConfig]) that all intents share, so that a sick server sees at
// most a tenth more requests, not ten times as many. A server that
// advertises its key's lifetime (Idempotency-Key-Expires) is never sent a
// retry after it, when the key might have been forgotten and the request
// would run again. Giving up is a [*GiveUpError], whose Reason says why.
//
// The whole guide is docs/client.md
// (https://github.com/onceflow/onceflow/blob/main/docs/client.md).
package idemclient
