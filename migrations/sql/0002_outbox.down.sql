DROP TABLE {schema}.onceflow_processed;
DROP TABLE {schema}.onceflow_outbox;
