-- The idempotency-key record: one row per (tenant, key), carrying the lease,
-- the recovery point of a workflow and, once finished, the stored response.
CREATE TABLE {schema}.onceflow_keys (
    tenant_id       text        NOT NULL CHECK (octet_length(tenant_id) BETWEEN 1 AND 255),
    key             text        NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 255),
    id              uuid        NOT NULL,
    workflow        text        NOT NULL CHECK (octet_length(workflow) BETWEEN 1 AND 255),
    request_hash    bytea       NOT NULL CHECK (octet_length(request_hash) = 32),
    -- request and state are json, not jsonb: stored as written, they hold
    -- any valid JSON, including \u0000 escapes and numbers beyond numeric.
    request         json,
    owner           uuid        NOT NULL,
    status          text        NOT NULL DEFAULT 'in_flight'
                                CHECK (status IN ('in_flight', 'completed', 'failed')),
    recovery_point  text,
    state           json,
    locked_until    timestamptz,
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error      text,
    response_status integer     CHECK (response_status BETWEEN 100 AND 999),
    response_body   bytea,
    response_header jsonb,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    completed_at    timestamptz,
    PRIMARY KEY (tenant_id, key),
    -- A record holds a lease exactly while it is in flight; a finished one
    -- has its response and the moment it finished.
    CHECK ((status = 'in_flight') = (locked_until IS NOT NULL)),
    CHECK ((status = 'in_flight') = (completed_at IS NULL)),
    CHECK ((status = 'in_flight') = (response_status IS NULL))
) WITH (fillfactor = 80);

-- The sweeper's two questions: whose lease has expired (among the few
-- records in flight), and what finished long enough ago to prune. The lease
-- itself is not indexed: a commit that extends it then updates the row in
-- place (a HOT update) instead of writing new index entries.
CREATE INDEX onceflow_keys_in_flight_idx
    ON {schema}.onceflow_keys (created_at) WHERE status = 'in_flight';
CREATE INDEX onceflow_keys_finished_idx
    ON {schema}.onceflow_keys (completed_at) WHERE status <> 'in_flight';
