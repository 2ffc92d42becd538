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
//
// # Retries, timeouts and deferrals
//
// Other systems fail for a moment. A [Retry] option tries the call again
// within the attempt, with the same key, after an exponential backoff with
// full jitter; [Timeout] bounds each try. Mark what no retry can fix with
// [Permanent]; [CheckResponse] classifies an HTTP answer (2xx success; 408,
// 425, 429 and 5xx transient, their Retry-After honoured, as an
// [*HTTPError]; any other status permanent). When the other system asks
// for a wait longer than a third of the engine's lease, the step returns a
// phase.DeferError and the key is handed back until then, instead of being
// held idle.
//
// # Pacing
//
// After an outage, the completer finds every abandoned call at once. A
// [Limit] puts a Mutation's tries under the engine's [Pace] for a
// downstream (workflow.Config Pacing): at most Concurrency calls at once
// and Rate a second, across every process sharing the database, and a
// circuit that a 429 with Retry-After opens for every key. The [Pacer]
// keeps them in PostgreSQL, one autocommit statement at a time, so it
// works behind PgBouncer; a waiting step holds no transaction and no
// connection, and a turn further off than a third of the lease defers the
// key with a [*WaitError].
package foreign
