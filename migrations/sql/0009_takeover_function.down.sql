-- Back to the claim of migration 0008, which spells the takeover rule out
-- itself, and without the takeover functions.
CREATE OR REPLACE FUNCTION {schema}.onceflow_claim(
    p_tenant text, p_key text, p_id uuid, p_workflow text, p_hash bytea, p_request json,
    p_owner uuid, p_lease bigint, p_abandoned text, p_principal bytea)
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
                      AND existing.request_hash = p_hash AND existing.workflow = p_workflow
                      AND coalesce(existing.principal_hash, sha256(convert_to(existing.tenant_id, 'UTF8'))) = p_principal) THEN
        RETURN NEXT existing;
        RETURN;
    END IF;

    lock_wait := current_setting('lock_timeout');
    PERFORM set_config('lock_timeout', '10ms', true);
    INSERT INTO {schema}.onceflow_keys AS k (tenant_id, key, id, workflow, request_hash, request, owner, locked_until, principal_hash)
    VALUES (p_tenant, p_key, p_id, p_workflow, p_hash, p_request, p_owner,
            clock_timestamp() + p_lease * interval '1 microsecond', p_principal)
    ON CONFLICT (tenant_id, key) DO UPDATE SET
        owner = p_owner,
        locked_until = clock_timestamp() + p_lease * interval '1 microsecond',
        updated_at = clock_timestamp(),
        attempts = k.attempts + (k.locked_until <> '-infinity')::int,
        last_error = CASE WHEN k.locked_until = '-infinity' THEN k.last_error ELSE p_abandoned END
    WHERE k.status = 'in_flight' AND k.locked_until < clock_timestamp()
      AND k.request_hash = EXCLUDED.request_hash AND k.workflow = EXCLUDED.workflow
      AND coalesce(k.principal_hash, sha256(convert_to(k.tenant_id, 'UTF8'))) = EXCLUDED.principal_hash
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

DROP FUNCTION {schema}.onceflow_take_over(text, text, text, bytea, bytea, uuid, bigint, text);
DROP FUNCTION {schema}.onceflow_may_take_over({schema}.onceflow_keys, text, bytea, bytea);
