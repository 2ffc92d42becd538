DROP FUNCTION {schema}.onceflow_claim(text, text, uuid, text, bytea, json, uuid, bigint, text);
