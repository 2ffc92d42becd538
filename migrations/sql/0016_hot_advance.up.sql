-- An advance is a HOT update. onceflow_keys_parked_idx (0010) indexed
-- updated_at, which every recovery point, release and hand-back sets: an
-- UPDATE that changes an indexed column cannot be HOT, so each advance
-- wrote a new entry into every index of the table (the primary key and
-- onceflow_keys_in_flight_idx) besides the row. What reads the index is
-- the completer's count of parked records per workflow; it now indexes the
-- workflow, which never changes, under the same predicate: the count reads
-- it alone (an index-only scan), and an advance, which changes no indexed
-- column, updates the row in place when its page has room (fillfactor 80,
-- 0001). Listing parked records by updated_at reads them through the same
-- index and sorts the few there are.
--
-- No statement names the index: builds from before this migration run
-- unchanged against it.
DROP INDEX {schema}.onceflow_keys_parked_idx;
CREATE INDEX onceflow_keys_parked_idx
    ON {schema}.onceflow_keys (workflow) WHERE status = 'parked';
