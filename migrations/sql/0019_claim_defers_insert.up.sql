-- A new key's record is written once in its first transaction, not twice.
-- The engine folds the claim of a workflow whose first step is an atomic
-- phase into that phase's transaction. Until now the claim inserted the
-- record, and the phase's recovery point updated it in the same
-- transaction: two versions of one row, both logged in full, where one
-- does. Since 0017 a duplicate is told by the key lock, not by the row, and
-- the uncommitted row is invisible to every other transaction anyway, so
-- the insert can wait for the phase's end and carry its outcome.
--
-- onceflow_claim_deferred is onceflow_claim (0017) with that difference:
-- for a key that has no record, it takes the key lock (0017, 0018),
-- reads the key again (a claim that held the lock may have committed its
-- record between the first read and the lock), and returns the record it
-- would have inserted without inserting it: its id is p_id, its history
-- holds the claim's 'claimed' entry, stamped now. The caller inserts it
-- with the first phase's recovery point or response, in that phase's
-- transaction, before the lock is released at its end. It never inserts:
-- a new record it returns (its id is p_id) is one to insert. Everything
-- else (a record to replay, one in flight, one to take over) is decided
-- as onceflow_claim decides it; a takeover still writes at once, since it
-- changes a committed row.
--
-- Builds since 0014 call onceflow_claim, which stays as 0017 left it and
-- inserts at once (so does this build for a claim on its own). They take
-- the key lock in every claim and takeover, so none of them writes the key
-- while this build's first phase holds it. A build from before 0014 claims without the lock: its INSERT
-- can commit a record for the key while this build's first phase runs.
-- This build's insert then fails on the primary key, and its first
-- transaction rolls back with everything the phase wrote: as a claim that
-- lost a race, the attempt reports a lost lease and did nothing.
CREATE FUNCTION {schema}.onceflow_claim_deferred(
    p_tenant text, p_key text, p_id uuid, p_workflow text, p_hash bytea, p_request json,
    p_owner uuid, p_lease bigint, p_abandoned text, p_principal bytea, p_definition text, p_undo boolean,
    p_trace text)
RETURNS SETOF {schema}.onceflow_keys
LANGUAGE plpgsql AS $onceflow_claim_deferred$
DECLARE
    existing {schema}.onceflow_keys;
    rec {schema}.onceflow_keys;
    lock_wait text;
    written boolean;
BEGIN
    SELECT * INTO existing FROM {schema}.onceflow_keys k WHERE k.tenant_id = p_tenant AND k.key = p_key;
    IF FOUND AND NOT {schema}.onceflow_may_take_over(existing, p_workflow, p_hash, p_principal, p_undo) THEN
        RETURN NEXT existing;
        RETURN;
    END IF;
    IF FOUND THEN
        -- A lease to take over: the takeover writes the committed row now,
        -- as onceflow_claim's does, waiting at most 1 s for its row lock.
        lock_wait := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', '1s', true);
        SELECT * INTO rec FROM {schema}.onceflow_take_over(
            p_tenant, p_key, p_workflow, p_hash, p_principal, p_owner, p_lease, p_abandoned, p_undo);
        written := FOUND;
        PERFORM set_config('lock_timeout', lock_wait, true);
        IF NOT written THEN
            -- Changed since the read: the row as it now is, or no row when
            -- it is gone, and the caller claims again.
            SELECT * INTO rec FROM {schema}.onceflow_keys k WHERE k.tenant_id = p_tenant AND k.key = p_key;
            IF NOT FOUND THEN
                RETURN;
            END IF;
        END IF;
        RETURN NEXT rec;
        RETURN;
    END IF;

    -- What this claim writes is written by the phase; on a server that
    -- refuses writes (a standby a failover left the connection on) it
    -- is refused here, as onceflow_claim's insert is, before anything
    -- runs, so that the caller answers 503 and resets its pool.
    IF current_setting('transaction_read_only') = 'on' THEN
        RAISE EXCEPTION 'cannot claim a key in a read-only transaction'
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    PERFORM {schema}.onceflow_lock_key(p_tenant, p_key);
    SELECT * INTO existing FROM {schema}.onceflow_keys k WHERE k.tenant_id = p_tenant AND k.key = p_key;
    IF FOUND THEN
        -- Committed between the read and the lock (by a claim that held
        -- it): the caller answers from the record as it now is.
        RETURN NEXT existing;
        RETURN;
    END IF;
    rec.tenant_id := p_tenant;
    rec.key := p_key;
    rec.id := p_id;
    rec.workflow := p_workflow;
    rec.request_hash := p_hash;
    rec.request := p_request;
    rec.owner := p_owner;
    rec.status := 'in_flight';
    rec.attempts := 0;
    rec.created_at := clock_timestamp();
    rec.updated_at := rec.created_at;
    rec.locked_until := rec.created_at + p_lease * interval '1 microsecond';
    rec.principal_hash := p_principal;
    rec.definition := p_definition;
    rec.trace_parent := p_trace;
    rec.history := {schema}.onceflow_history(NULL, 'claimed', p_owner);
    RETURN NEXT rec;
END
$onceflow_claim_deferred$;
