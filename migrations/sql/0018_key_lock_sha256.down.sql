-- Back to 0017: the key lock derived from hashtextextended.
CREATE OR REPLACE FUNCTION {schema}.onceflow_lock_key(p_tenant text, p_key text)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $onceflow_lock_key$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended(
            '{schema}:' || length(p_tenant) || ':' || p_tenant || p_key, 0)) THEN
        RAISE EXCEPTION 'the key is being claimed or taken over by another transaction'
            USING ERRCODE = 'lock_not_available';
    END IF;
END
$onceflow_lock_key$;
