package recovery

import (
	"strconv"
	"strings"
	"time"

	"github.com/onceflow/onceflow/internal/dbschema"
)

// Claim outcomes as the claim statement reports them in its outcome column.
const (
	claimedNew      = 1
	claimedTakeover = 2
	claimedExisting = 3
	claimedByOther  = 4 // the record belongs to another principal
)

// claimSQL decides a claim in one round trip and returns one row: the
// record as it now is, how it was reached, and the database clock. The
// decision is the function onceflow_claim's (migrations 0005, 0009 and 0017
// say how it decides; the takeover rule is onceflow_may_take_over's): it
// reads the row first and writes only when the key is absent or may be
// taken over, so a replay, or a claim of a key held by a valid lease,
// writes nothing. When its write finds the row changed since its read (a
// concurrent claim inserted it or took it over), it returns the row as it
// now is; it returns no row only when the row was deleted in between, and
// Claim then runs it again.
//
// A record whose principal is not the caller's is never taken over, and is
// reported as claimedByOther (migration 0008; a record made before it has
// no principal and counts as the tenant's own).
//
// Parameters: $1 tenant, $2 key, $3 new id, $4 workflow, $5 fingerprint,
// $6 request, $7 new owner, $8 lease in microseconds, $9 the error recorded
// when taking over a lease whose holder stopped without releasing it, $10
// the principal's hash, $11 the definition (migration 0010), $12 the
// traceparent stored with a new record (migration 0014). The true before it
// says this build knows compensation: it may take over a record whose undo
// list a build from before migration 0012 must leave alone.
var claimSQL = `
SELECT ` + claimColumns + `, ` + claimOutcome + `, ` + claimBound + `
FROM {schema}.onceflow_claim` + claimCall

// claimBound is the claim statements' last column, whose value is not
// read: when the claim took the key (a new key or a takeover), it bounds
// the transaction it ran in. Until that transaction commits, nothing but
// its being open holds the key (see Config.IdleTimeout). {idle_bound},
// which newQueries fills in, sets idle_in_transaction_session_timeout
// local to the transaction, unless the role or session set one (anything
// but 0). In a statement outside a transaction block it bounds nothing.
const claimBound = `CASE WHEN id = $3 OR owner = $7 THEN {idle_bound} END`

// claimOutcome is the claim statements' outcome column, and the database
// clock.
const claimOutcome = `CASE WHEN id = $3 THEN 1 WHEN owner = $7 THEN 2
    WHEN coalesce(principal_hash, sha256(convert_to(tenant_id, 'UTF8'))) <> $10 THEN 4 ELSE 3 END, clock_timestamp()`

// claimCall is the claim functions' arguments.
const claimCall = `($1::text, $2::text, $3::uuid, $4::text, $5::bytea, $6::json, $7::uuid, $8::bigint, $9::text, $10::bytea, $11::text, true, $12::text) c`

// claimDeferredSQL is claimSQL for a claim that opens a workflow's first
// transaction: for an absent key the function onceflow_claim_deferred
// (migration 0019) returns the record without inserting it, and the
// transaction's first fenced write inserts it (see unwritten). Its
// next-to-last column is that record's history, with the claim's entry;
// NULL for any other row.
var claimDeferredSQL = `
SELECT ` + claimColumns + `, ` + claimOutcome + `, CASE WHEN id = $3 THEN history END, ` + claimBound + `
FROM {schema}.onceflow_claim_deferred` + claimCall

// takeoverSQL takes over an expired lease whatever the fingerprint, for work
// resumed from its stored request. The rule and what a takeover writes are
// the database's, written once for the claim and this statement: the
// function onceflow_take_over (migration 0009), here with no fingerprint
// and no principal to match. It takes the key's lock without waiting
// (migration 0017) and fails with lockNotAvailable while another
// transaction holds it. Like claimSQL it returns the record and how it
// was reached: 2 taken over, 3 left as it was (finished, held by a valid
// lease, or of another workflow). No row means no record. Its last column
// bounds the transaction of a takeover made in one, as claimBound does.
//
// Parameters: $1 tenant, $2 key, $3 new owner, $4 lease in microseconds, $5
// the error recorded for an abandoned lease, $6 the workflow the record must
// belong to.
var takeoverSQL = `
WITH existing AS (
    SELECT ` + claimColumns + ` FROM {keys} WHERE tenant_id = $1 AND key = $2
),
taken AS (
    SELECT ` + claimColumns + `
    FROM {schema}.onceflow_take_over($1::text, $2::text, $6::text, NULL, NULL, $3::uuid, $4::bigint, $5::text, true)
)
SELECT ` + recordColumns + `, 2, clock_timestamp(), {idle_bound} FROM taken
UNION ALL
SELECT ` + recordColumns + `, 3, clock_timestamp(), NULL FROM existing WHERE NOT EXISTS (SELECT 1 FROM taken)`

// Every statement that makes a transition appends it to the record's
// history in the same statement (onceflow_history, migration 0014): the
// kind, the owner token of the attempt that made it (in a SET, owner is
// the old value), and the step and error it concerns.

// fence is the guard on every write after the claim.
const fence = `tenant_id = $1 AND key = $2 AND owner = $3 AND status = 'in_flight'`

const (
	// loadSQL reads a record and the database's clock.
	loadSQL = `SELECT ` + recordColumns + `, clock_timestamp() FROM {keys} WHERE tenant_id = $1 AND key = $2`

	advanceSQL = `UPDATE {keys} SET recovery_point = $4, state = $5::json,
    history = {schema}.onceflow_history(history, 'phase_committed', owner, $4),
    locked_until = clock_timestamp() + $6::bigint * interval '1 microsecond', updated_at = clock_timestamp()
WHERE ` + fence

	// finishSQL completes or fails a record: $4 status, $5 response status,
	// $6 body, $7 header, $8 last error, $9 recovery point, $10 state (NULL
	// keeps the old value of each of those three), $11 the transition.
	finishSQL = `UPDATE {keys} SET status = $4, locked_until = NULL, not_before = NULL,
    response_status = $5, response_body = $6, response_header = $7::jsonb,
    last_error = coalesce($8, last_error),
    recovery_point = coalesce($9, recovery_point), state = coalesce($10::json, state),
    history = {schema}.onceflow_history(history, $11, owner, coalesce($9, recovery_point), $8),
    completed_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE ` + fence

	// releaseSQL sets the status too: an operator's release of a parked
	// record puts it back in flight, and of a deferred one ends its
	// deferral, so that a retry or the completer takes it over at once. $5
	// is the transition: the attempt's release or an operator's.
	releaseSQL = `UPDATE {keys} SET status = 'in_flight', locked_until = '-infinity', owner = gen_random_uuid(),
    history = {schema}.onceflow_history(history, $5, owner, recovery_point, $4),
    not_before = NULL, attempts = attempts + 1, last_error = $4, updated_at = clock_timestamp()
WHERE ` + fence

	handBackSQL = `UPDATE {keys} SET locked_until = '-infinity', owner = gen_random_uuid(),
    history = {schema}.onceflow_history(history, 'handed_back', owner, recovery_point, $4),
    last_error = $4, updated_at = clock_timestamp()
WHERE ` + fence

	// handBackForSQL releases the lease like releaseSQL, counting $6 (0
	// or 1) attempts, and defers the record: no takeover before $5
	// microseconds from now by the database clock (see
	// onceflow_may_take_over, migration 0011). It returns that time.
	handBackForSQL = `UPDATE {keys} SET locked_until = '-infinity', owner = gen_random_uuid(),
    not_before = clock_timestamp() + $5::bigint * interval '1 microsecond',
    history = {schema}.onceflow_history(history, 'deferred', owner, recovery_point, $4),
    attempts = attempts + $6::int, last_error = $4, updated_at = clock_timestamp()
WHERE ` + fence + `
RETURNING not_before`

	// renewSQL extends the lease only: a renewal is not progress, so
	// updated_at (what "stuck for" measures) stays. A renewal that comes
	// after the lease ended by the database clock, when nothing took the
	// record over yet, is late: for that while a claim could have taken
	// the key from a holder still at work. The history records it, with
	// by how much.
	renewSQL = `UPDATE {keys} SET locked_until = clock_timestamp() + $4::bigint * interval '1 microsecond',
    history = CASE WHEN locked_until < clock_timestamp() THEN {schema}.onceflow_history(history, 'renewed_late', owner,
        recovery_point, 'the lease had ended ' || (clock_timestamp() - locked_until)::text || ' before') ELSE history END
WHERE ` + fence + `
RETURNING locked_until`

	// operatorFence replaces the fence of an operator's release or fail, in
	// the statement that writes: the record is parked, or in flight with a
	// lease that ended by the database clock (a released one at
	// -infinity), so that a holder that renewed it since the operator
	// looked keeps it.
	operatorFence = `tenant_id = $1 AND key = $2 AND owner = $3
  AND (status = 'parked' OR (status = 'in_flight' AND locked_until < clock_timestamp()))`

	// parkSQL parks a record the attempt holding it may not run: no lease,
	// a retired owner token, $4 why. An operator's choice of definition
	// (resume_as) that could not be honoured is spent, so that an
	// operator's release tries the rules again.
	parkSQL = `UPDATE {keys} SET status = 'parked', locked_until = NULL, owner = gen_random_uuid(),
    history = {schema}.onceflow_history(history, 'parked', owner, recovery_point, $4),
    last_error = $4, resume_as = NULL, updated_at = clock_timestamp()
WHERE ` + fence

	// restampSQL records that the attempt holding the record runs it under
	// definition $4, from recovery point $5 (renamed) with state $6
	// (upgraded): what a resume under a changed definition writes first.
	// An operator's choice of definition (resume_as) is then spent.
	restampSQL = `UPDATE {keys} SET definition = $4, recovery_point = $5, state = coalesce($6::json, state), resume_as = NULL,
    history = {schema}.onceflow_history(history, 'restamped', owner, $5, p_definition => $4)
WHERE ` + fence

	// unparkSQL puts a parked record back in flight, to be run under
	// definition $4, released so that the next claim or the completer takes
	// it over at once; $5 is kept as the last error.
	unparkSQL = `UPDATE {keys} SET status = 'in_flight', locked_until = '-infinity', owner = gen_random_uuid(),
    history = {schema}.onceflow_history(history, 'resumed_as', owner, recovery_point, $5, $4),
    resume_as = $4, last_error = $5, updated_at = clock_timestamp()
WHERE tenant_id = $1 AND key = $2 AND owner = $3 AND status = 'parked'`

	saveDefinitionSQL = `INSERT INTO {schema}.onceflow_definitions (workflow, fingerprint, version, spec)
VALUES ($1, $2, $3, $4::json) ON CONFLICT (workflow, fingerprint) DO NOTHING`

	// definitionsSQL lists stored definitions: $1 workflow ("" all), $2
	// fingerprint ("" all), and when $3, only those a record in flight or
	// parked was written by or is to be resumed as.
	definitionsSQL = `SELECT workflow, fingerprint, version, spec, created_at FROM {schema}.onceflow_definitions d
WHERE ($1 = '' OR workflow = $1) AND ($2 = '' OR fingerprint = $2)
  AND (NOT $3 OR EXISTS (SELECT 1 FROM {keys} k WHERE k.workflow = d.workflow AND k.status IN ('in_flight', 'parked')
                         AND (k.definition = d.fingerprint OR k.resume_as = d.fingerprint)))
ORDER BY workflow, created_at, fingerprint`

	// compensateSQL starts compensating: $4 the steps to undo, in order,
	// $5-$7 the response the key will answer once they are undone, $8 the
	// state (NULL keeps it), $9 the cause, kept as the last error. The
	// lease is renewed, and attempts start again from zero: the
	// compensations get their own.
	compensateSQL = `UPDATE {keys} SET undo = $4::text[],
    history = {schema}.onceflow_history(history, 'compensating', owner, recovery_point, $9),
    response_status = $5, response_body = $6, response_header = $7::jsonb,
    state = coalesce($8::json, state), last_error = $9, attempts = 0,
    locked_until = clock_timestamp() + $10::bigint * interval '1 microsecond', updated_at = clock_timestamp()
WHERE ` + fence + ` AND undo IS NULL`

	// undoneSQL commits the compensation of step $4, the head of the list,
	// with state $5 and removes it from the list; the last one finishes the
	// record as compensated, and the history records both. It returns
	// whether it did.
	undoneSQL = `UPDATE {keys} SET undo = undo[2:], state = $5::json, updated_at = clock_timestamp(),
    history = CASE WHEN cardinality(undo) = 1
        THEN {schema}.onceflow_history({schema}.onceflow_history(history, 'undone', owner, $4), 'compensated', owner, $4)
        ELSE {schema}.onceflow_history(history, 'undone', owner, $4) END,
    status = CASE WHEN cardinality(undo) = 1 THEN 'compensated' ELSE status END,
    locked_until = CASE WHEN cardinality(undo) = 1 THEN NULL
        ELSE clock_timestamp() + $6::bigint * interval '1 microsecond' END,
    completed_at = CASE WHEN cardinality(undo) = 1 THEN clock_timestamp() END
WHERE ` + fence + ` AND undo[1] = $4
RETURNING status = 'compensated'`

	deleteUnstartedSQL = `DELETE FROM {keys} WHERE ` + fence + ` AND recovery_point IS NULL`

	// listSQL filters records for operators: $1 tenant, $2 status, $3
	// microseconds without progress (in flight only), $4 limit, $5
	// workflow, $6 compensating only, $7-$8 created from and before, $9-$11
	// the position to list after (updated_at, tenant, key); empty, 0, false
	// or NULL matches all. {after} and {order} make the listing oldest or
	// newest first (listOrder).
	listSQL = `SELECT ` + recordColumns + ` FROM {keys}
WHERE ($1 = '' OR tenant_id = $1) AND ($2 = '' OR status = $2)
  AND ($3::bigint = 0 OR (status = 'in_flight' AND updated_at < clock_timestamp() - $3::bigint * interval '1 microsecond'))
  AND ($5 = '' OR workflow = $5)
  AND (NOT $6::bool OR (status = 'in_flight' AND cardinality(undo) > 0))
  AND ($7::timestamptz IS NULL OR created_at >= $7) AND ($8::timestamptz IS NULL OR created_at < $8)
  AND ($9::timestamptz IS NULL OR (updated_at, tenant_id, key) {after} ($9::timestamptz, $10::text, $11::text))
ORDER BY updated_at {order}, tenant_id {order}, key {order}
LIMIT $4`

	// expireSQL ends a lease now, as if its holder had stopped renewing it.
	// A released lease stays released.
	expireSQL = `UPDATE {keys} SET locked_until = least(locked_until, clock_timestamp() - interval '1 millisecond'),
    history = {schema}.onceflow_history(history, 'lease_expired', owner, recovery_point),
    updated_at = clock_timestamp()
WHERE tenant_id = $1 AND key = $2 AND status = 'in_flight'`
)

// sameTransactionSQL goes before an owner's COMMIT of a transaction it
// lent (opentx): it raises OF002 when $1 is not the transaction's mark, so
// that the COMMIT behind it does not run.
const sameTransactionSQL = `SELECT {schema}.onceflow_same_transaction($1)`

// queries holds the statements with the schema filled in.
type queries struct {
	claim, claimDeferred, insert, takeover, load, list, listNewest, advance, finish, release, handBack, renew, deleteUnstarted, expire string
	advanceOrFail, finishOrFail                                                                                                        string
	releaseLeaseOver, finishLeaseOver, handBackFor                                                                                     string
	park, restamp, unpark, saveDefinition, definitions                                                                                 string
	compensate, undone                                                                                                                 string
	sameTransaction                                                                                                                    string
}

func newQueries(schema string, idle time.Duration) *queries {
	bound := "NULL" // IdleTimeout negative: the transaction is left as it is
	if idle > 0 {
		// A literal, not a parameter: with a parameter in it, the claim
		// is planned anew on every run (about 30 µs of server time).
		ms := (idle + time.Millisecond - 1) / time.Millisecond
		bound = `CASE WHEN current_setting('idle_in_transaction_session_timeout') = '0'
    THEN set_config('idle_in_transaction_session_timeout', '` + strconv.FormatInt(int64(ms), 10) + `', true) END`
	}
	expand := func(sql string) string {
		sql = strings.ReplaceAll(sql, "{idle_bound}", bound)
		return dbschema.Expand(strings.ReplaceAll(sql, "{keys}", "{schema}.onceflow_keys"), schema)
	}
	return &queries{
		claim:           expand(claimSQL),
		claimDeferred:   expand(claimDeferredSQL),
		insert:          expand(insertSQL),
		takeover:        expand(takeoverSQL),
		expire:          expand(expireSQL),
		load:            expand(loadSQL),
		list:            expand(listOrder(listSQL, false)),
		listNewest:      expand(listOrder(listSQL, true)),
		advance:         expand(advanceSQL),
		advanceOrFail:   expand(orFail(advanceSQL)),
		finishOrFail:    expand(orFail(finishSQL)),
		finish:          expand(finishSQL),
		release:         expand(releaseSQL),
		handBack:        expand(handBackSQL),
		handBackFor:     expand(handBackForSQL),
		renew:           expand(renewSQL),
		deleteUnstarted: expand(deleteUnstartedSQL),

		releaseLeaseOver: expand(strings.Replace(releaseSQL, fence, operatorFence, 1)),
		finishLeaseOver:  expand(strings.Replace(finishSQL, fence, operatorFence, 1)),

		park:           expand(parkSQL),
		restamp:        expand(restampSQL),
		unpark:         expand(unparkSQL),
		saveDefinition: expand(saveDefinitionSQL),
		definitions:    expand(definitionsSQL),
		compensate:     expand(compensateSQL),
		undone:         expand(undoneSQL),

		sameTransaction: expand(sameTransactionSQL),
	}
}

// listOrder fills listSQL's order: oldest first, or newest first.
func listOrder(sql string, newest bool) string {
	after, order := ">", "ASC"
	if newest {
		after, order = "<", "DESC"
	}
	return strings.NewReplacer("{after}", after, "{order}", order).Replace(sql)
}
