ALTER TABLE {schema}.onceflow_keys
    DROP CONSTRAINT onceflow_keys_lease_check,
    ALTER COLUMN tenant_id TYPE text,
    ALTER COLUMN key TYPE text,
    ALTER COLUMN workflow TYPE text,
    ADD CONSTRAINT onceflow_keys_tenant_id_check CHECK (octet_length(tenant_id) BETWEEN 1 AND 255),
    ADD CONSTRAINT onceflow_keys_key_check CHECK (octet_length(key) BETWEEN 1 AND 255),
    ADD CONSTRAINT onceflow_keys_workflow_check CHECK (octet_length(workflow) BETWEEN 1 AND 255),
    ADD CONSTRAINT onceflow_keys_request_hash_check CHECK (octet_length(request_hash) = 32),
    ADD CONSTRAINT onceflow_keys_status_check CHECK (status IN ('in_flight', 'completed', 'failed')),
    ADD CONSTRAINT onceflow_keys_attempts_check CHECK (attempts >= 0),
    ADD CONSTRAINT onceflow_keys_response_status_check CHECK (response_status BETWEEN 100 AND 999),
    ADD CONSTRAINT onceflow_keys_check CHECK ((status = 'in_flight') = (locked_until IS NOT NULL)),
    ADD CONSTRAINT onceflow_keys_check1 CHECK ((status = 'in_flight') = (completed_at IS NULL)),
    ADD CONSTRAINT onceflow_keys_check2 CHECK ((status = 'in_flight') = (response_status IS NULL));

DROP DOMAIN {schema}.onceflow_name;
