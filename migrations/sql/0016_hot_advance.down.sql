-- Back to 0010's index of parked records by updated_at.
DROP INDEX {schema}.onceflow_keys_parked_idx;
CREATE INDEX onceflow_keys_parked_idx
    ON {schema}.onceflow_keys (updated_at) WHERE status = 'parked';
