-- Back to the claim of migration 0009, which stores no definition. A parked
-- record has no status to go back to: down fails while one exists (fail or
-- release it first).
DROP FUNCTION {schema}.onceflow_claim(text, text, uuid, text, bytea, json, uuid, bigint, text, bytea, text);

CREATE FUNCTION {schema}.onceflow_claim(
    p_tenant text, p_key text, p_id uuid, p_workflow text, p_hash bytea, p_request json,
    p_owner uuid, p_lease bigint, p_abandoned text, p_principal bytea)
RETURNS SETOF {schema}.onceflow_keys
LANGUAGE plpgsql AS $onceflow_claim$
DECLARE
    existing {schema}.onceflow_keys;
    rec {schema}.onceflow_keys;
    lock_wait text;
    written boolean := false;
BEGIN
    SELECT * INTO existing FROM {schema}.onceflow_keys k WHERE k.tenant_id = p_tenant AND k.key = p_key;
    IF FOUND AND NOT {schema}.onceflow_may_take_over(existing, p_workflow, p_hash, p_principal) THEN
        RETURN NEXT existing;
        RETURN;
    END IF;

    lock_wait := current_setting('lock_timeout');
    PERFORM set_config('lock_timeout', '10ms', true);
    IF existing.tenant_id IS NULL THEN
        INSERT INTO {schema}.onceflow_keys (tenant_id, key, id, workflow, request_hash, request, owner, locked_until, principal_hash)
        VALUES (p_tenant, p_key, p_id, p_workflow, p_hash, p_request, p_owner,
                clock_timestamp() + p_lease * interval '1 microsecond', p_principal)
        ON CONFLICT (tenant_id, key) DO NOTHING
        RETURNING * INTO rec;
        written := FOUND;
    END IF;
    IF NOT written THEN
        SELECT * INTO rec FROM {schema}.onceflow_take_over(
            p_tenant, p_key, p_workflow, p_hash, p_principal, p_owner, p_lease, p_abandoned);
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

DROP TABLE {schema}.onceflow_definitions;
DROP INDEX {schema}.onceflow_keys_parked_idx;
ALTER TABLE {schema}.onceflow_keys
    DROP CONSTRAINT onceflow_keys_lease_check,
    ADD CONSTRAINT onceflow_keys_lease_check CHECK (CASE status
        WHEN 'in_flight' THEN locked_until IS NOT NULL
        WHEN 'completed' THEN locked_until IS NULL
        WHEN 'failed' THEN locked_until IS NULL
        ELSE false END),
    DROP COLUMN definition,
    DROP COLUMN resume_as;
