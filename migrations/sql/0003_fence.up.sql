-- A fenced write sent in one round trip with its COMMIT must fail, not
-- match zero rows, when the fence does not hold: the error aborts the
-- transaction, so the COMMIT behind it cannot commit the attempt's writes.
-- This function raises that error, with its own SQLSTATE.
CREATE FUNCTION {schema}.onceflow_lease_lost() RETURNS integer
LANGUAGE plpgsql AS $onceflow_body$
BEGIN
    RAISE EXCEPTION 'onceflow: lease lost: another attempt owns this idempotency key'
        USING ERRCODE = 'OF001';
END
$onceflow_body$;
