-- Deferral: a step that the other system told to come back later
-- (phase.DeferError, a Retry-After longer than the lease) hands the key back
-- with a time before which nothing may take it over. not_before holds that
-- time by the database clock; NULL means none. It is set only together
-- with a released lease ('-infinity'), so the record holds no lease while
-- it waits. The hand-back that sets it counts an attempt (so that
-- MaxAttempts bounds a downstream that defers for ever); the takeover after
-- it, of a released lease, counts none.
--
-- The takeover rule refuses a record whose not_before is still ahead: a
-- claim returns the record untouched (the caller answers ErrInFlight, with
-- the time left), and so does the takeover of Engine.Resume and the
-- completer. The takeover that comes after it clears not_before. Both
-- functions keep their signatures, so the claim function of 0010 calls them
-- unchanged.
--
-- not_before is not indexed: like the lease, it changes in place (a HOT
-- update). The completer reads it among the records in flight, which the
-- partial index onceflow_keys_in_flight_idx finds.
ALTER TABLE {schema}.onceflow_keys ADD COLUMN not_before timestamptz;

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
