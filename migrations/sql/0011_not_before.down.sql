-- Back to the takeover functions of migration 0009, which know no
-- not_before. A record deferred when this runs becomes a plain released
-- one: the next claim or the completer takes it over at once.
CREATE OR REPLACE FUNCTION {schema}.onceflow_may_take_over(
    k {schema}.onceflow_keys, p_workflow text, p_hash bytea, p_principal bytea)
RETURNS boolean
LANGUAGE sql VOLATILE AS $onceflow_may_take_over$
    SELECT k.status = 'in_flight' AND k.locked_until < clock_timestamp() AND k.workflow = p_workflow
       AND (p_hash IS NULL OR k.request_hash = p_hash)
       AND (p_principal IS NULL OR coalesce(k.principal_hash, sha256(convert_to(k.tenant_id, 'UTF8'))) = p_principal)
$onceflow_may_take_over$;

CREATE OR REPLACE FUNCTION {schema}.onceflow_take_over(
    p_tenant text, p_key text, p_workflow text, p_hash bytea, p_principal bytea,
    p_owner uuid, p_lease bigint, p_abandoned text)
RETURNS SETOF {schema}.onceflow_keys
LANGUAGE sql VOLATILE AS $onceflow_take_over$
    UPDATE {schema}.onceflow_keys AS k SET
        owner = p_owner,
        locked_until = clock_timestamp() + p_lease * interval '1 microsecond',
        updated_at = clock_timestamp(),
        attempts = k.attempts + (k.locked_until <> '-infinity')::int,
        last_error = CASE WHEN k.locked_until = '-infinity' THEN k.last_error ELSE p_abandoned END
    WHERE k.tenant_id = p_tenant AND k.key = p_key
      AND {schema}.onceflow_may_take_over(k, p_workflow, p_hash, p_principal)
    RETURNING *
$onceflow_take_over$;

ALTER TABLE {schema}.onceflow_keys DROP COLUMN not_before;
