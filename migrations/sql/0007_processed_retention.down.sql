DROP INDEX {schema}.onceflow_outbox_undelivered_idx;
DROP INDEX {schema}.onceflow_processed_at_idx;
