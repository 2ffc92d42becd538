-- History and trace context. Each record keeps the transitions it went
-- through (history) and the W3C traceparent of the request that created it
-- (trace_parent), for operators (onceflow keys show, package admin) and for
-- traces that follow a key across retries.
--
-- history is {"truncated": n, "entries": [...]}: the latest 50 transitions,
-- oldest first, each {at, kind, owner, step?, error?, definition?}, and how
-- many older ones were dropped from the front to keep it at 50. at is the
-- database clock; owner the owner token of the attempt that made the
-- transition (the new one for a claim or a takeover); error is cut to 200
-- characters, so a record's history stays under a few tens of kilobytes.
-- A transition is appended by the statement that makes it, in its
-- transaction, through onceflow_history: no statement or commit of its own.
-- NULL means no transition was recorded yet (a record made before this
-- migration, or by a build from before it, until its next transition).
--
-- trace_parent is written by the claim that inserts the record and never
-- changed. The claim function gains it as its last parameter, p_trace, in a
-- new signature; the signatures older builds call (0010's and 0012's) stay
-- and store none. The takeover function keeps its signatures and records
-- the takeover; everything else of 0012's rule is unchanged.
ALTER TABLE {schema}.onceflow_keys
    ADD COLUMN history jsonb,
    ADD COLUMN trace_parent text CHECK (octet_length(trace_parent) BETWEEN 1 AND 255);

-- onceflow_history is PL/pgSQL, not SQL: its plans are kept for the
-- session, where a SQL function with a subquery would be planned again in
-- every statement that calls it.
CREATE FUNCTION {schema}.onceflow_history(
    h jsonb, p_kind text, p_owner uuid, p_step text DEFAULT NULL, p_error text DEFAULT NULL, p_definition text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS $onceflow_history$
DECLARE
    entries jsonb := coalesce(h->'entries', '[]') || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
        'at', clock_timestamp(), 'kind', p_kind, 'owner', p_owner, 'step', p_step,
        'error', left(p_error, 200), 'definition', p_definition)));
    truncated bigint := coalesce((h->>'truncated')::bigint, 0);
    n int := jsonb_array_length(entries);
BEGIN
    IF n > 50 THEN
        entries := jsonb_path_query_array(entries, '$[last - 49 to last]');
        truncated := truncated + n - 50;
    END IF;
    RETURN jsonb_build_object('truncated', truncated, 'entries', entries);
END
$onceflow_history$;

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
        last_error = CASE WHEN k.locked_until = '-infinity' THEN k.last_error ELSE p_abandoned END,
        history = {schema}.onceflow_history(k.history, 'taken_over', p_owner, k.recovery_point,
            CASE WHEN k.locked_until <> '-infinity' THEN p_abandoned END)
    WHERE k.tenant_id = p_tenant AND k.key = p_key
      AND {schema}.onceflow_may_take_over(k, p_workflow, p_hash, p_principal, p_undo)
    RETURNING *
$onceflow_take_over$;

CREATE FUNCTION {schema}.onceflow_claim(
    p_tenant text, p_key text, p_id uuid, p_workflow text, p_hash bytea, p_request json,
    p_owner uuid, p_lease bigint, p_abandoned text, p_principal bytea, p_definition text, p_undo boolean,
    p_trace text)
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
                                            principal_hash, definition, trace_parent, history)
        VALUES (p_tenant, p_key, p_id, p_workflow, p_hash, p_request, p_owner,
                clock_timestamp() + p_lease * interval '1 microsecond', p_principal, p_definition, p_trace,
                {schema}.onceflow_history(NULL, 'claimed', p_owner))
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
