// Package idemhttp makes net/http handlers idempotent under the
// Idempotency-Key header. It works with any router that takes an
// http.Handler.
//
// Middleware wraps any handler: it claims the key (scoped by tenant), runs
// the handler, stores the status, the allow-listed headers and the body
// verbatim, and answers every retry with them and Idempotent-Replayed: true.
// A handler may make its business writes in the transaction that commits
// the stored response (Tx), for the strongest guarantee: the effect and its
// record never disagree.
//
// Workflow serves a workflow: it decodes the request body, runs the
// workflow under the key (workflow.Engine.Run) and writes its response.
//
// # Who may see a stored response
//
// A replay skips the handler, and with it whatever checks the handler
// makes. So both sit after your authentication, and Config says what it
// established: Config.Tenant (required) scopes keys, and Config.Principal
// (default: the tenant itself) binds each record to its caller within the
// tenant; any other caller sending the same key gets 403 and learns
// nothing of the record. TenantFromTrustedHeader reads the tenant from a
// header set by an authenticating proxy, refusing repeated values.
//
// # Answers
//
// Both answer with RFC 9457 problem details (application/problem+json):
//
//	missing Idempotency-Key                      400 (or the route opts out)
//	empty, longer than 255 or unprintable key    400
//	a key followed by more than its parameters   400
//	Tenant or Principal fails                    401 (or a RequestError's status)
//	the key made by another principal            403
//	the body not arrived within BodyTimeout      408
//	body over the limit                          413 (before 100 Continue)
//	a request with the key in flight             409, Retry-After
//	the key reused with a different request      422
//	the database unreachable                     503, the handler not run
//
// The key may be sent as a bare token (abc) or an RFC 8941 string ("abc"),
// with parameters. The fingerprint covers the method, the route, the path
// and query, the media type and the body; a body of a JSON media type is
// canonicalized first, so key order and whitespace do not matter.
// Responses StoreDefault refuses (temporary refusals and 5xx) and responses
// over MaxResponse are answered but not stored.
package idemhttp
