-- Back to 0011, which knows no compensation. A compensated record becomes
-- a failed one (its stored response stays); a record still compensating,
-- in flight or parked, has no state to go back to (0011 would run it
-- forward from its recovery point, after its failure was decided): down
-- fails while one exists (let it finish, or fail it first).
DO $onceflow_down$
BEGIN
    IF EXISTS (SELECT 1 FROM {schema}.onceflow_keys WHERE status IN ('in_flight', 'parked') AND undo IS NOT NULL) THEN
        RAISE EXCEPTION 'onceflow: a record is still compensating; let it finish or fail it before migrating down';
    END IF;
END
$onceflow_down$;

UPDATE {schema}.onceflow_keys SET status = 'failed' WHERE status = 'compensated';

ALTER TABLE {schema}.onceflow_keys
    DROP COLUMN undo,
    DROP CONSTRAINT onceflow_keys_lease_check,
    ADD CONSTRAINT onceflow_keys_lease_check CHECK (CASE status
        WHEN 'in_flight' THEN locked_until IS NOT NULL
        WHEN 'completed' THEN locked_until IS NULL
        WHEN 'failed' THEN locked_until IS NULL
        WHEN 'parked' THEN locked_until IS NULL
        ELSE false END);
