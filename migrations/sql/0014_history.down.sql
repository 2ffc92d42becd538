-- Back to 0013: the claim and takeover functions as 0012 left them, no
-- history, no trace context.
DROP FUNCTION {schema}.onceflow_claim(text, text, uuid, text, bytea, json, uuid, bigint, text, bytea, text, boolean, text);

CREATE OR REPLACE FUNCTION {schema}.onceflow_take_over(
    p_tenant text, p_key text, p_workflow text, p_hash bytea, p_principal bytea,
    p_owner uuid, p_lease bigint, p_abandoned text, p_undo boolean)
RETURNS SETOF {schema}.onceflow_keys
LANGUAGE sql VOLATILE AS $onceflow_take_over$
    UPDATE {schema}.onceflow_keys AS k SET
        owner = p_owner,
        locked_until = clock_timestamp() + p_lease * interval '1 microsecond',
        not_before = NULL,
        updated_at = clock_timestamp(),
        attempts = k.attempts + (k.locked_until <> '-infinity')::int,
        last_error = CASE WHEN k.locked_until = '-infinity' THEN k.last_error ELSE p_abandoned END
    WHERE k.tenant_id = p_tenant AND k.key = p_key
      AND {schema}.onceflow_may_take_over(k, p_workflow, p_hash, p_principal, p_undo)
    RETURNING *
$onceflow_take_over$;

DROP FUNCTION {schema}.onceflow_history(jsonb, text, uuid, text, text, text);

ALTER TABLE {schema}.onceflow_keys
    DROP COLUMN history,
    DROP COLUMN trace_parent;
