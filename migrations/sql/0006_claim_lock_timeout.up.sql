-- A duplicate must not wait for the first phase of the request it
-- duplicates. A first claim stays uncommitted while the workflow's first
-- atomic phase runs in the same transaction, and the claim's INSERT ... ON
-- CONFLICT of a duplicate waits for that transaction: a burst of duplicates
-- of one slow request held a connection each for the phase's whole length
-- and could exhaust the pool. The insert now waits at most 10 ms for a row
-- lock (lock_timeout, set for that one statement and put back after it):
-- past that it fails with SQLSTATE 55P03, which the caller answers as "in
-- flight" (HTTP 409, Retry-After) at once. The read before it and the
-- table's own lock are not bounded here: a locked table is the database
-- being unavailable, which the caller's own deadline bounds.
--
-- The function otherwise decides exactly as 0005's does (see there). The
-- body is quoted with a tag no schema name can hold (dbschema.Pattern has
-- no "$").
CREATE OR REPLACE FUNCTION {schema}.onceflow_claim(
    p_tenant text, p_key text, p_id uuid, p_workflow text, p_hash bytea, p_request json,
    p_owner uuid, p_lease bigint, p_abandoned text)
RETURNS SETOF {schema}.onceflow_keys
LANGUAGE plpgsql AS $onceflow_claim$
DECLARE
    existing {schema}.onceflow_keys;
    rec {schema}.onceflow_keys;
    lock_wait text;
    written boolean;
BEGIN
    SELECT * INTO existing FROM {schema}.onceflow_keys k WHERE k.tenant_id = p_tenant AND k.key = p_key;
    IF FOUND AND NOT (existing.status = 'in_flight' AND existing.locked_until < clock_timestamp()
                      AND existing.request_hash = p_hash AND existing.workflow = p_workflow) THEN
        RETURN NEXT existing;
        RETURN;
    END IF;

    lock_wait := current_setting('lock_timeout');
    PERFORM set_config('lock_timeout', '10ms', true);
    INSERT INTO {schema}.onceflow_keys AS k (tenant_id, key, id, workflow, request_hash, request, owner, locked_until)
    VALUES (p_tenant, p_key, p_id, p_workflow, p_hash, p_request, p_owner,
            clock_timestamp() + p_lease * interval '1 microsecond')
    ON CONFLICT (tenant_id, key) DO UPDATE SET
        owner = p_owner,
        locked_until = clock_timestamp() + p_lease * interval '1 microsecond',
        updated_at = clock_timestamp(),
        attempts = k.attempts + (k.locked_until <> '-infinity')::int,
        last_error = CASE WHEN k.locked_until = '-infinity' THEN k.last_error ELSE p_abandoned END
    WHERE k.status = 'in_flight' AND k.locked_until < clock_timestamp()
      AND k.request_hash = EXCLUDED.request_hash AND k.workflow = EXCLUDED.workflow
    RETURNING * INTO rec;
    written := FOUND; -- before PERFORM, which sets FOUND too
    PERFORM set_config('lock_timeout', lock_wait, true);
    IF written THEN
        RETURN NEXT rec;
    ELSIF existing.tenant_id IS NOT NULL THEN
        RETURN NEXT existing;
    END IF;
END
$onceflow_claim$;
