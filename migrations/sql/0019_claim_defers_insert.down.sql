-- Back to 0018: every claim inserts its record at once.
DROP FUNCTION {schema}.onceflow_claim_deferred(text, text, uuid, text, bytea, json, uuid, bigint, text, bytea, text, boolean, text);
