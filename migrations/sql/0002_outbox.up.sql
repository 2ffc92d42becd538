-- Messages for side effects that cannot take an idempotency key (email,
-- SMS). A message is written in the same transaction as the business
-- change and delivered at least once by a relay.
CREATE TABLE {schema}.onceflow_outbox (
    id           bigserial   PRIMARY KEY,
    topic        text        NOT NULL CHECK (octet_length(topic) BETWEEN 1 AND 255),
    -- Stable per effect: consumers drop a message whose key they processed.
    dedupe_key   text        NOT NULL CHECK (octet_length(dedupe_key) BETWEEN 1 AND 255),
    payload      json        NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}',
    status       text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'dead')),
    attempts     integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- When a relay may take the message next: now for a new message, after
    -- a backoff for a failed one, after the relay's lease for one in delivery.
    available_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- Set by each take: the relay's outcome write must present it, so a
    -- relay whose lease ran out cannot record an outcome for the message.
    lease_token  uuid,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    delivered_at timestamptz,
    UNIQUE (topic, dedupe_key),
    CHECK ((status = 'delivered') = (delivered_at IS NOT NULL))
);

CREATE INDEX onceflow_outbox_pending_idx
    ON {schema}.onceflow_outbox (available_at) WHERE status = 'pending';
CREATE INDEX onceflow_outbox_delivered_idx
    ON {schema}.onceflow_outbox (delivered_at) WHERE status = 'delivered';

-- What consumers have processed: one row per (consumer, message key),
-- written in the consumer's own transaction, so a redelivery is refused by
-- the primary key however late it arrives.
CREATE TABLE {schema}.onceflow_processed (
    consumer     text        NOT NULL CHECK (octet_length(consumer) BETWEEN 1 AND 255),
    dedupe_key   text        NOT NULL CHECK (octet_length(dedupe_key) BETWEEN 1 AND 255),
    processed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (consumer, dedupe_key)
);
