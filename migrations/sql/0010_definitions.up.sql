-- Versioned workflow definitions. A record remembers the definition that
-- wrote it (definition: the definition's fingerprint), so that a process
-- running a changed definition can tell whether it may resume the record
-- (the change lies after the recovery point) or must park it for an
-- operator. onceflow_definitions keeps every definition that claimed a
-- key: what a process needs to compare a record's definition with its own
-- when it no longer has the old one in its code, and what `onceflow
-- workflows export` writes for a deploy check. A record made before this
-- migration has no definition and resumes as before.
--
-- A parked record is not run: no claim takes it over (the takeover rule
-- wants in_flight), the completer does not pick it, and the pruner keeps
-- it. It holds no lease; an operator releases, resumes or fails it.
--
-- The claim function gains the definition, which a new record stores; it
-- decides as 0009's does.
ALTER TABLE {schema}.onceflow_keys
    ADD COLUMN definition text CHECK (octet_length(definition) BETWEEN 1 AND 255),
    ADD COLUMN resume_as text CHECK (octet_length(resume_as) BETWEEN 1 AND 255),
    DROP CONSTRAINT onceflow_keys_lease_check,
    ADD CONSTRAINT onceflow_keys_lease_check CHECK (CASE status
        WHEN 'in_flight' THEN locked_until IS NOT NULL
        WHEN 'completed' THEN locked_until IS NULL
        WHEN 'failed' THEN locked_until IS NULL
        WHEN 'parked' THEN locked_until IS NULL
        ELSE false END);

CREATE INDEX onceflow_keys_parked_idx
    ON {schema}.onceflow_keys (updated_at) WHERE status = 'parked';

CREATE TABLE {schema}.onceflow_definitions (
    workflow    {schema}.onceflow_name NOT NULL,
    fingerprint text        NOT NULL CHECK (octet_length(fingerprint) BETWEEN 1 AND 255),
    version     text        NOT NULL CHECK (octet_length(version) BETWEEN 1 AND 255),
    spec        json        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (workflow, fingerprint)
);

DROP FUNCTION {schema}.onceflow_claim(text, text, uuid, text, bytea, json, uuid, bigint, text, bytea);

CREATE FUNCTION {schema}.onceflow_claim(
    p_tenant text, p_key text, p_id uuid, p_workflow text, p_hash bytea, p_request json,
    p_owner uuid, p_lease bigint, p_abandoned text, p_principal bytea, p_definition text)
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
        INSERT INTO {schema}.onceflow_keys (tenant_id, key, id, workflow, request_hash, request, owner, locked_until,
                                            principal_hash, definition)
        VALUES (p_tenant, p_key, p_id, p_workflow, p_hash, p_request, p_owner,
                clock_timestamp() + p_lease * interval '1 microsecond', p_principal, p_definition)
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
