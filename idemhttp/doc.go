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
// Both answer with RFC 9457 problem details (application/problem+json):
//
//	missing Idempotency-Key                      400 (or the route opts out)
//	empty, longer than 255 or unprintable key    400
//	missing tenant                               401
//	body over the limit                          413
//	a request with the key in flight             409, Retry-After
//	the key reused with a different request      422
//	the database unreachable                     503, the handler not run
//
// The key may be sent as a bare token (abc) or an RFC 8941 string ("abc").
// The fingerprint covers the method, the route and the body; a JSON body is
// canonicalized first, so key order and whitespace do not matter.
package idemhttp
