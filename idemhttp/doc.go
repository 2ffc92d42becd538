// Package idemhttp makes net/http handlers idempotent under the
// Idempotency-Key header. It works with any router that takes an
// http.Handler.
//
// [Middleware] wraps any handler: it claims the key (scoped by tenant), runs
// the handler, stores the status, the allow-listed headers and the body
// verbatim, and answers every retry with them and Idempotent-Replayed: true.
// A handler may make its business writes in the transaction that commits
// the stored response ([Tx]), for the strongest guarantee: the effect and
// its record never disagree.
//
// [Workflow] serves a workflow: it decodes the request body, runs the
// workflow under the key ([workflow.Workflow.Run]) and writes its response.
//
// # Who may see a stored response
//
// A replay skips the handler, and with it whatever checks the handler
// makes. So both sit after your authentication, and [Config] says what it
// established: [Config].Tenant (required) scopes keys, and
// [Config].Principal (default: the tenant itself) binds each record to its
// caller within the tenant; any other caller sending the same key gets 403
// and learns nothing of the record. [TenantFromTrustedHeader] reads the
// tenant from a header set by an authenticating proxy, refusing repeated
// values.
//
// # Answers
//
// Both answer refusals with RFC 9457 problem details
// (application/problem+json): 400 for a missing or malformed key, 401 (or a
// [RequestError]'s status) when Tenant or Principal fails, 403 for another
// principal's key, 408 and 413 for a body too slow or too large, 409 with
// Retry-After while the key is in flight, 422 for the key reused with a
// different request, and 503 when the database does not answer, with the
// handler not run. The table of every case, and the security model, are in
// docs/http.md (https://github.com/onceflow/onceflow/blob/main/docs/http.md).
//
// # The key's lifetime, and waiting for a key in flight
//
// Every answer about a key whose record is kept says, in [ExpiresHeader]
// (Idempotency-Key-Expires, an HTTP-date), the earliest moment the server
// may forget the key: a replay, the record's completion plus
// [Config].KeyLifetime; the handler's stored answer, 409 in flight and a
// workflow's 500 or 503 that leave the key resumable, now plus it. It is
// a moment of this process's clock, which Date carries too, however far
// the database's clock is off it. Set KeyLifetime to the pruner's
// retention (sweeper.PrunerConfig). Answers
// about no record of the caller's (400, 401, 403, 422, an unstored
// answer) carry none, and no stored response holds it.
//
// A request whose key is in flight may ask to wait for it with Prefer:
// wait=N (RFC 7240): it claims the key again with backoff, holding no
// database connection, for up to N seconds ([Config].MaxWait at most),
// then answers as a retry would, with [PreferenceAppliedHeader]; past N,
// 409. [Config].MaxWaiters bounds the requests waiting at once.
//
// The key may be sent as a bare token (abc) or an RFC 8941 string ("abc"),
// with parameters. The fingerprint covers the method, the route, the path
// and query, the media type and the body; a body of a JSON media type is
// canonicalized first, so key order and whitespace do not matter, unless
// its meaning may depend on them: a body with two names that
// encoding/json reads as one ("amount" and "AMOUNT") is taken byte for
// byte.
// Responses [StoreDefault] refuses (temporary refusals and 5xx) and
// responses over [Config].MaxResponse are answered but not stored.
//
// # Conditional writes
//
// A write that names the version it read, with If-Match, needs no key: its
// retry finds a newer version and gets 412. [ETag] tags a row's version,
// [CheckPreconditions] evaluates If-Match and If-None-Match (RFC 9110),
// [WritePrecondition] answers 304, 400, 412 and 428, and [VersionedUpdate]
// is the compare-and-set on the row's version column.
package idemhttp
