-- The takeover rule, written once. Until now the claim function (0005,
-- 0006, 0008) and the statement that resumes a record without its client
-- (recovery's Takeover) each spelled out when a record may be taken over and
-- what a takeover writes. Two functions now hold both, and the claim and
-- Takeover call them:
--
-- onceflow_may_take_over(k, workflow, hash, principal) says whether record
-- k may be taken over: it is in flight, its lease has ended by the database
-- clock, it belongs to the workflow, and, when hash and principal are not
-- NULL (a claim by a client), it was claimed with that fingerprint and by
-- that principal (a record made before 0008 has none and counts as the
-- tenant's own). A resume from the stored request passes NULL for both.
--
-- onceflow_take_over(...) takes the record over when the rule allows, in one
-- UPDATE: a new owner and lease; a lease that ran out without being handed
-- back ('-infinity') belonged to an attempt that stopped, so it counts as an
-- attempt and p_abandoned is recorded. The rule is checked in the UPDATE's
-- WHERE, which PostgreSQL checks again against the latest row version after
-- waiting for a concurrent writer: of two concurrent takeovers only one
-- matches. It returns the record taken over, or no row.
--
-- The claim decides as 0008's does: it reads the row and returns it
-- untouched when the rule refuses it (a replay or a valid lease writes
-- nothing); otherwise it inserts a new record or, when there is one (read
-- first, or committed concurrently since), takes it over, both under a
-- 10 ms lock_timeout (0006). When neither writes, the row changed after
-- the read, and the claim returns it as it now is, or no row when it was
-- deleted (the caller then claims again, as 0008's upsert would have
-- inserted). p_lease is in microseconds.
CREATE FUNCTION {schema}.onceflow_may_take_over(
    k {schema}.onceflow_keys, p_workflow text, p_hash bytea, p_principal bytea)
RETURNS boolean
LANGUAGE sql VOLATILE AS $onceflow_may_take_over$
    SELECT k.status = 'in_flight' AND k.locked_until < clock_timestamp() AND k.workflow = p_workflow
       AND (p_hash IS NULL OR k.request_hash = p_hash)
       AND (p_principal IS NULL OR coalesce(k.principal_hash, sha256(convert_to(k.tenant_id, 'UTF8'))) = p_principal)
$onceflow_may_take_over$;

CREATE FUNCTION {schema}.onceflow_take_over(
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

CREATE OR REPLACE FUNCTION {schema}.onceflow_claim(
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
