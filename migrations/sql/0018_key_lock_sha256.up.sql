-- The key lock (0017) is derived from SHA-256, not hashtextextended. The
-- lock is a 64-bit number, and two keys that map to one number share it:
-- while one is claimed, the other is answered "in flight". By chance that
-- is negligible; but hashtextextended is not built to resist a chosen
-- collision, so a tenant that knew another tenant's key could make a key of
-- its own with the same number and, by holding claims of it open, keep the
-- other's fresh claims and takeovers answered 409. The first 8 bytes of a
-- SHA-256 of the same text cannot be aimed at like that. Nothing else
-- changes: the lock decides no write (the unique index and the takeover's
-- rule do), so builds and transactions on either side of this migration
-- never both hold one key.
CREATE OR REPLACE FUNCTION {schema}.onceflow_lock_key(p_tenant text, p_key text)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $onceflow_lock_key$
BEGIN
    IF NOT pg_try_advisory_xact_lock(('x' || left(encode(sha256(convert_to(
            '{schema}:' || length(p_tenant) || ':' || p_tenant || p_key, 'UTF8')), 'hex'), 16))::bit(64)::bigint) THEN
        RAISE EXCEPTION 'the key is being claimed or taken over by another transaction'
            USING ERRCODE = 'lock_not_available';
    END IF;
END
$onceflow_lock_key$;
