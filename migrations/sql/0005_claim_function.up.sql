-- The claim, on every request's path, as one function call. The statement
-- it replaces (a CTE around INSERT ... ON CONFLICT) made PostgreSQL set up
-- the insert even when it did not run: for a replay, the most frequent
-- claim, that set-up cost more than reading the row. The function reads the
-- row first and writes only when the key is absent or may be taken over.
--
-- It decides exactly as the statement did. A record that is finished, held
-- by a valid lease, or claimed with another fingerprint or workflow is
-- returned as it is (outcome 3), with no write. Otherwise it inserts a new
-- record (outcome 1) or, on conflict, takes the record over (outcome 2):
-- ON CONFLICT waits for a concurrent claim's transaction and checks the
-- takeover condition again against the latest row version, so of two
-- concurrent takeovers only one matches. When the insert neither inserted
-- nor took over, the record read first is returned as it was (outcome 3),
-- or, if there was none (a concurrent first claim committed after the
-- read), no row, and the caller claims again.
--
-- p_lease is in microseconds; p_abandoned is the error recorded when taking
-- over a lease whose holder stopped without releasing it.
CREATE FUNCTION {schema}.onceflow_claim(
    p_tenant text, p_key text, p_id uuid, p_workflow text, p_hash bytea, p_request json,
    p_owner uuid, p_lease bigint, p_abandoned text)
RETURNS SETOF {schema}.onceflow_keys
LANGUAGE plpgsql AS $onceflow_body$
DECLARE
    existing {schema}.onceflow_keys;
    rec {schema}.onceflow_keys;
BEGIN
    SELECT * INTO existing FROM {schema}.onceflow_keys k WHERE k.tenant_id = p_tenant AND k.key = p_key;
    IF FOUND AND NOT (existing.status = 'in_flight' AND existing.locked_until < clock_timestamp()
                      AND existing.request_hash = p_hash AND existing.workflow = p_workflow) THEN
        RETURN NEXT existing;
        RETURN;
    END IF;

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
    IF FOUND THEN
        RETURN NEXT rec;
    ELSIF existing.tenant_id IS NOT NULL THEN
        RETURN NEXT existing;
    END IF;
END
$onceflow_body$;
