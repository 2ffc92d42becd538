-- The pruner's two questions about consumers' records of processed messages
-- (sweeper.PrunerConfig.ProcessedRetention): which are older than the
-- retention, oldest first; and, for each, whether a message with its dedupe
-- key is pending or dead, in any topic. Without these, every batch reads
-- both tables whole. The second index holds undelivered messages only, few
-- at any time. Building them locks writes to the two tables for as long as
-- the build takes, once: onceflow_processed was never pruned before.
CREATE INDEX onceflow_processed_at_idx ON {schema}.onceflow_processed (processed_at);
CREATE INDEX onceflow_outbox_undelivered_idx
    ON {schema}.onceflow_outbox (dedupe_key) WHERE status <> 'delivered';
