-- Pacing of foreign calls (foreign.Limit, workflow.Config.Pacing), shared by
-- every process that calls a downstream: each statement below runs alone, in
-- autocommit, so that the pacing works behind PgBouncer's transaction
-- pooling (no session state, no session locks, no LISTEN).
--
-- onceflow_pace holds one row per downstream and scope (scope is '' or, for
-- a limit per tenant, the tenant): a token bucket for the rate (tokens as of
-- refilled_at, refilled from the elapsed time by the database clock) and the
-- circuit (open_until: a 429 with Retry-After holds every call back until
-- then). A call reserves a token in one statement and sleeps until it is
-- due, so tokens may go below zero by the reservations not yet due.
CREATE TABLE {schema}.onceflow_pace (
    downstream  text NOT NULL CHECK (length(downstream) BETWEEN 1 AND 255),
    scope       text NOT NULL CHECK (length(scope) <= 255),
    tokens      float8 NOT NULL,
    refilled_at timestamptz NOT NULL,
    open_until  timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (downstream, scope)
);

-- onceflow_pace_slots holds the concurrency limit's slots, slot 0 to the
-- limit less one, made when first needed. A call holds one (holder, a
-- random uuid) until held_until, renewed while the call runs; a holder that
-- dies frees its slot when held_until passes. A claim considers only the
-- slots below the configured limit, so a lowered limit leaves none of the
-- others usable.
CREATE TABLE {schema}.onceflow_pace_slots (
    downstream text NOT NULL,
    scope      text NOT NULL,
    slot       int NOT NULL CHECK (slot >= 0),
    holder     uuid,
    held_until timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (downstream, scope, slot)
);
