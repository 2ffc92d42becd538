-- Compensation (sagas). A workflow that fails terminally before its point
-- of no return undoes what its foreign steps did: it runs the compensation
-- of every started step, latest first, each as a durable step of its own.
-- undo holds the steps whose compensations are still to run, in the order
-- they run; NULL means the record is not compensating. The attempt that
-- decides to compensate stores the list together with the failure response
-- the key will answer, and the record stays in flight: claims, Resume and
-- the completer take it over as any record in flight, and the attempt that
-- holds it runs the compensations left. Each finished compensation removes
-- its step from the head of the list, fenced, in the statement that
-- commits it; the one that empties the list finishes the record as
-- 'compensated', a finished status whose stored response every retry gets.
ALTER TABLE {schema}.onceflow_keys
    ADD COLUMN undo text[] CHECK (cardinality(undo) <= 1000),
    DROP CONSTRAINT onceflow_keys_lease_check,
    ADD CONSTRAINT onceflow_keys_lease_check CHECK (CASE status
        WHEN 'in_flight' THEN locked_until IS NOT NULL
        WHEN 'completed' THEN locked_until IS NULL
        WHEN 'failed' THEN locked_until IS NULL
        WHEN 'parked' THEN locked_until IS NULL
        WHEN 'compensated' THEN locked_until IS NULL
        ELSE false END);
