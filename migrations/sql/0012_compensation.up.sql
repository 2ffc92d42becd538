-- Compensation (sagas). A workflow that fails terminally before its point
-- of no return undoes what its foreign steps did: it runs the compensation
-- of every started step, latest first, each as a durable step of its own.
-- undo holds the steps whose compensations are still to run, in the order
-- they run; NULL means the record is not compensating. The attempt that
-- decides to compensate stores the list together with the failure response
-- the key will answer, and the record stays in flight: claims, Resume and
-- the completer take it over as any record in flight, and the attempt that
-- holds it runs the compensations left. Each finished compensation removes
-- its step from the head of the list, fenced, in the statement that
-- commits it; the one that empties the list finishes the record as
-- 'compensated', a finished status whose stored response every retry gets.
--
-- A build from before this migration must not take a compensating record
-- over: it would run the workflow forward after its failure was decided
-- (ship what was refunded). The takeover rule of the signatures such a
-- build calls (onceflow_may_take_over and onceflow_take_over as 0011 left
-- them, onceflow_claim as 0010 did) now refuses a record with an undo
-- list, so that build answers "in flight" for it; builds that know
-- compensation call the new signatures, whose last parameter, p_undo, lets
-- them take such a record over. The rest of the rule is 0011's.
ALTER TABLE {schema}.onceflow_keys
    ADD COLUMN undo text[] CHECK (cardinality(undo) <= 1000),
    DROP CONSTRAINT onceflow_keys_lease_check,
    ADD CONSTRAINT onceflow_keys_lease_check CHECK (CASE status
        WHEN 'in_flight' THEN locked_until IS NOT NULL
        WHEN 'completed' THEN locked_until IS NULL
        WHEN 'failed' THEN locked_until IS NULL
        WHEN 'parked' THEN locked_until IS NULL
        WHEN 'compensated' THEN locked_until IS NULL
        ELSE false END);

CREATE OR REPLACE FUNCTION {schema}.onceflow_may_take_over(
    k {schema}.onceflow_keys, p_workflow text, p_hash bytea, p_principal bytea, p_undo boolean)
RETURNS boolean
LANGUAGE sql VOLATILE AS $onceflow_may_take_over$
    SELECT k.status = 'in_flight' AND k.locked_until < clock_timestamp() AND k.workflow = p_workflow
       AND (k.not_before IS NULL OR k.not_before <= clock_timestamp())
       AND (p_undo OR k.undo IS NULL)
       AND (p_hash IS NULL OR k.request_hash = p_hash)
       AND (p_principal IS NULL OR coalesce(k.principal_hash, sha256(convert_to(k.tenant_id, 'UTF8'))) = p_principal)
$onceflow_may_take_over$;

CREATE OR REPLACE FUNCTION {schema}.onceflow_may_take_over(
    k {schema}.onceflow_keys, p_workflow text, p_hash bytea, p_principal bytea)
RETURNS boolean
LANGUAGE sql VOLATILE AS $onceflow_may_take_over$
    SELECT {schema}.onceflow_may_take_over(k, p_workflow, p_hash, p_principal, false)
$onceflow_may_take_over$;

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

CREATE OR REPLACE FUNCTION {schema}.onceflow_take_over(
    p_tenant text, p_key text, p_workflow text, p_hash bytea, p_principal bytea,
    p_owner uuid, p_lease bigint, p_abandoned text)
RETURNS SETOF {schema}.onceflow_keys
LANGUAGE sql VOLATILE AS $onceflow_take_over$
    SELECT * FROM {schema}.onceflow_take_over(p_tenant, p_key, p_workflow, p_hash, p_principal, p_owner, p_lease, p_abandoned, false)
$onceflow_take_over$;

CREATE FUNCTION {schema}.onceflow_claim(
    p_tenant text, p_key text, p_id uuid, p_workflow text, p_hash bytea, p_request json,
    p_owner uuid, p_lease bigint, p_abandoned text, p_principal bytea, p_definition text, p_undo boolean)
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
