-- A fresh key is never "in flight". Since 0006 the claim has answered a
-- duplicate at once by lowering lock_timeout to 10 ms around its write: the
-- duplicate's INSERT waits on the uncommitted first claim (whose first
-- phase runs in the same transaction) and gives up. But lock_timeout bounds
-- every heavyweight lock wait of the statement, not only that one: on a
-- loaded server the INSERT of a brand-new key waits for the relation
-- extension lock of the table or of one of its indexes (another backend,
-- descheduled, holds it while it adds a page), or for a table lock a
-- statement such as CREATE INDEX holds, and after 10 ms the claim failed
-- with SQLSTATE 55P03, which the caller answers as "in flight" (409) for a
-- key nobody holds.
--
-- A duplicate is now recognised by a lock of its own, taken without
-- waiting: onceflow_lock_key takes a transaction-scoped advisory lock on
-- the key (a 64-bit hash of the schema, the tenant and the key), and raises
-- 55P03 at once when another transaction holds it, which the caller answers
-- as before ("in flight", Contended). The claim takes it after its read,
-- only when it is about to write (a replay, or a key held by a valid lease,
-- takes no lock), and the takeover (onceflow_take_over, which the claim,
-- Engine.Resume and the completer call) takes it too, so that a claim that
-- reads an expired lease while another attempt takes the record over, its
-- first phase running in the takeover's transaction, is answered at once
-- as well. The lock is held to the end of the transaction that took it:
-- through a first phase folded into the claim's transaction, and, for a
-- claim on its own, only for its statement. It is transaction-scoped, so
-- PgBouncer's transaction pooling keeps it with the transaction that took
-- it (a session-scoped lock would stay with a server connection that
-- another client then gets). Locks of one transaction stack: the claim's
-- call of the takeover takes the lock it holds again.
--
-- The claim's writes then wait only for what is no duplicate: a relation
-- extension, a short write of the record by its holder or the pruner, a
-- build from before this migration that claims without the lock (below).
-- lock_timeout is now 1 s around them, a bound for a pathological wait
-- rather than the test of a duplicate; past it the claim still fails with
-- 55P03 and is answered "in flight", and nothing ran.
--
-- Two keys whose hashes are equal (about one pair in 2^64) share the lock:
-- while one is being claimed, a claim of the other is answered "in flight"
-- for the length of that transaction, and a retry gets through. No write
-- depends on the lock: safety stays with the unique index and the
-- takeover's rule, checked again in its UPDATE.
--
-- Rolling deploys. The function bodies are replaced in place, under the
-- signatures builds since 0014 call, so those builds take the lock as soon
-- as this migration is applied. Builds from before 0014 call the claim's
-- signatures of 0010 and 0012, which stay as they were: their INSERT takes
-- no lock, and waits 10 ms for a duplicate as before; only their takeover,
-- through onceflow_take_over, takes it. Such a build and this one still
-- never both claim one key: of two INSERTs of it, the unique index lets one
-- commit and makes the other's ON CONFLICT DO NOTHING insert nothing, and
-- of two takeovers, the rule in the UPDATE's WHERE is checked again against
-- the latest row version after waiting, so only one matches. A claim of
-- this build that meets such a build's uncommitted claim waits for it up to
-- 1 s instead of 10 ms, then answers "in flight". Going down restores 0014's
-- bodies.
CREATE FUNCTION {schema}.onceflow_lock_key(p_tenant text, p_key text)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $onceflow_lock_key$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended(
            '{schema}:' || length(p_tenant) || ':' || p_tenant || p_key, 0)) THEN
        RAISE EXCEPTION 'the key is being claimed or taken over by another transaction'
            USING ERRCODE = 'lock_not_available';
    END IF;
END
$onceflow_lock_key$;

CREATE OR REPLACE FUNCTION {schema}.onceflow_take_over(
    p_tenant text, p_key text, p_workflow text, p_hash bytea, p_principal bytea,
    p_owner uuid, p_lease bigint, p_abandoned text, p_undo boolean)
RETURNS SETOF {schema}.onceflow_keys
LANGUAGE sql VOLATILE AS $onceflow_take_over$
    SELECT {schema}.onceflow_lock_key(p_tenant, p_key);
    UPDATE {schema}.onceflow_keys AS k SET
        owner = p_owner,
        locked_until = clock_timestamp() + p_lease * interval '1 microsecond',
        not_before = NULL,
        updated_at = clock_timestamp(),
        attempts = k.attempts + (k.locked_until <> '-infinity')::int,
        last_error = CASE WHEN k.locked_until = '-infinity' THEN k.last_error ELSE p_abandoned END,
        history = {schema}.onceflow_history(k.history, 'taken_over', p_owner, k.recovery_point,
            CASE WHEN k.locked_until <> '-infinity' THEN p_abandoned END)
    WHERE k.tenant_id = p_tenant AND k.key = p_key
      AND {schema}.onceflow_may_take_over(k, p_workflow, p_hash, p_principal, p_undo)
    RETURNING *
$onceflow_take_over$;

CREATE OR REPLACE FUNCTION {schema}.onceflow_claim(
    p_tenant text, p_key text, p_id uuid, p_workflow text, p_hash bytea, p_request json,
    p_owner uuid, p_lease bigint, p_abandoned text, p_principal bytea, p_definition text, p_undo boolean,
    p_trace text)
RETURNS SETOF {schema}.onceflow_keys
LANGUAGE plpgsql AS $onceflow_claim$
DECLARE
    existing {schema}.onceflow_keys;
    rec {schema}.onceflow_keys;
    lock_wait text;
    written boolean := false;
BEGIN
    SELECT * INTO existing FROM {schema}.onceflow_keys k WHERE k.tenant_id = p_tenant AND k.key = p_key;
    IF FOUND AND NOT {schema}.onceflow_may_take_over(existing, p_workflow, p_hash, p_principal, p_undo) THEN
        RETURN NEXT existing;
        RETURN;
    END IF;

    PERFORM {schema}.onceflow_lock_key(p_tenant, p_key);
    lock_wait := current_setting('lock_timeout');
    PERFORM set_config('lock_timeout', '1s', true);
    IF existing.tenant_id IS NULL THEN
        INSERT INTO {schema}.onceflow_keys (tenant_id, key, id, workflow, request_hash, request, owner, locked_until,
                                            principal_hash, definition, trace_parent, history)
        VALUES (p_tenant, p_key, p_id, p_workflow, p_hash, p_request, p_owner,
                clock_timestamp() + p_lease * interval '1 microsecond', p_principal, p_definition, p_trace,
                {schema}.onceflow_history(NULL, 'claimed', p_owner))
        ON CONFLICT (tenant_id, key) DO NOTHING
        RETURNING * INTO rec;
        written := FOUND;
    END IF;
    IF NOT written THEN
        SELECT * INTO rec FROM {schema}.onceflow_take_over(
            p_tenant, p_key, p_workflow, p_hash, p_principal, p_owner, p_lease, p_abandoned, p_undo);
        written := FOUND;
    END IF;
    PERFORM set_config('lock_timeout', lock_wait, true);
    IF written THEN
        RETURN NEXT rec;
        RETURN;
    END IF;
    -- The row changed since the read: a concurrent claim inserted it or
    -- took it over, or it was deleted. Return it as it now is, or no row
    -- when it is gone, so that the caller claims again.
    SELECT * INTO rec FROM {schema}.onceflow_keys k WHERE k.key = p_key AND k.tenant_id = p_tenant;
    IF FOUND THEN
        RETURN NEXT rec;
    END IF;
END
$onceflow_claim$;
