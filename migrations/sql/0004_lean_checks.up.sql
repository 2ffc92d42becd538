-- PostgreSQL 15 rebuilds each CHECK expression of a table from its stored
-- text every time a statement writes a row, and the key record is written
-- three times per workflow: its ten checks cost more than the write. The
-- length rules move into a domain, whose check PostgreSQL prepares once and
-- runs only where a value is assigned (on insert: tenant, key and workflow
-- never change). One small check stays: the status is known, and a record
-- holds a lease exactly while it is in flight. onceflow's statements keep
-- the other rules (a finished record has its response and completed_at).
CREATE DOMAIN {schema}.onceflow_name AS text CHECK (octet_length(VALUE) BETWEEN 1 AND 255);

ALTER TABLE {schema}.onceflow_keys
    DROP CONSTRAINT onceflow_keys_tenant_id_check,
    DROP CONSTRAINT onceflow_keys_key_check,
    DROP CONSTRAINT onceflow_keys_workflow_check,
    DROP CONSTRAINT onceflow_keys_request_hash_check,
    DROP CONSTRAINT onceflow_keys_status_check,
    DROP CONSTRAINT onceflow_keys_attempts_check,
    DROP CONSTRAINT onceflow_keys_response_status_check,
    DROP CONSTRAINT onceflow_keys_check,
    DROP CONSTRAINT onceflow_keys_check1,
    DROP CONSTRAINT onceflow_keys_check2,
    ALTER COLUMN tenant_id TYPE {schema}.onceflow_name,
    ALTER COLUMN key TYPE {schema}.onceflow_name,
    ALTER COLUMN workflow TYPE {schema}.onceflow_name,
    ADD CONSTRAINT onceflow_keys_lease_check CHECK (CASE status
        WHEN 'in_flight' THEN locked_until IS NOT NULL
        WHEN 'completed' THEN locked_until IS NULL
        WHEN 'failed' THEN locked_until IS NULL
        ELSE false END);
