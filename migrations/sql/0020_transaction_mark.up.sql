-- A transaction lent to an atomic phase or to an idemhttp handler must end
-- only with its owner's COMMIT, which carries the recovery point or the
-- stored response. The owner marks the transaction when it opens it (the
-- transaction-local setting onceflow.transaction, set to a value of its
-- own) and sends this check in one round trip with its COMMIT. A borrower
-- that ended or restarted the transaction (COMMIT AND CHAIN, COMMIT; BEGIN,
-- ROLLBACK AND CHAIN) left a transaction without the mark: the check
-- raises, and the COMMIT behind it does not run.
CREATE FUNCTION {schema}.onceflow_same_transaction(p_mark text) RETURNS integer
LANGUAGE plpgsql AS $onceflow_body$
BEGIN
    IF current_setting('onceflow.transaction', true) IS DISTINCT FROM p_mark THEN
        RAISE EXCEPTION 'onceflow: the transaction was ended or restarted by the phase or handler it was lent to'
            USING ERRCODE = 'OF002';
    END IF;
    RETURN 1;
END
$onceflow_body$;
