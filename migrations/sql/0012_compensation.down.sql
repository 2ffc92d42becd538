-- Back to 0011, which knows no compensation. A compensated record becomes
-- a failed one (its stored response stays); a record still compensating,
-- in flight or parked, has no state to go back to (0011 would run it
-- forward from its recovery point, after its failure was decided): down
-- fails while one exists (let it finish, or fail it first).
DO $onceflow_down$
BEGIN
    IF EXISTS (SELECT 1 FROM {schema}.onceflow_keys WHERE status IN ('in_flight', 'parked') AND undo IS NOT NULL) THEN
        RAISE EXCEPTION 'onceflow: a record is still compensating; let it finish or fail it before migrating down';
    END IF;
END
$onceflow_down$;

UPDATE {schema}.onceflow_keys SET status = 'failed' WHERE status = 'compensated';

DROP FUNCTION {schema}.onceflow_claim(text, text, uuid, text, bytea, json, uuid, bigint, text, bytea, text, boolean);
DROP FUNCTION {schema}.onceflow_take_over(text, text, text, bytea, bytea, uuid, bigint, text, boolean);
DROP FUNCTION {schema}.onceflow_may_take_over({schema}.onceflow_keys, text, bytea, bytea, boolean);

CREATE OR REPLACE FUNCTION {schema}.onceflow_may_take_over(
    k {schema}.onceflow_keys, p_workflow text, p_hash bytea, p_principal bytea)
RETURNS boolean
LANGUAGE sql VOLATILE AS $onceflow_may_take_over$
    SELECT k.status = 'in_flight' AND k.locked_until < clock_timestamp() AND k.workflow = p_workflow
       AND (k.not_before IS NULL OR k.not_before <= clock_timestamp())
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
        not_before = NULL,
        updated_at = clock_timestamp(),
        attempts = k.attempts + (k.locked_until <> '-infinity')::int,
        last_error = CASE WHEN k.locked_until = '-infinity' THEN k.last_error ELSE p_abandoned END
    WHERE k.tenant_id = p_tenant AND k.key = p_key
      AND {schema}.onceflow_may_take_over(k, p_workflow, p_hash, p_principal)
    RETURNING *
$onceflow_take_over$;


ALTER TABLE {schema}.onceflow_keys
    DROP COLUMN undo,
    DROP CONSTRAINT onceflow_keys_lease_check,
    ADD CONSTRAINT onceflow_keys_lease_check CHECK (CASE status
        WHEN 'in_flight' THEN locked_until IS NOT NULL
        WHEN 'completed' THEN locked_until IS NULL
        WHEN 'failed' THEN locked_until IS NULL
        WHEN 'parked' THEN locked_until IS NULL
        ELSE false END);
