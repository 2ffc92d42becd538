-- A cheaper history append. onceflow_history (0014) was PL/pgSQL: every
-- statement that recorded a transition paid for a call into the PL/pgSQL
-- interpreter, set up anew in each transaction, and for building the
-- whole history twice. It is now one SQL expression, which PostgreSQL
-- inlines into the statement that calls it: the entries are extracted
-- once, the new transition appended, and at 50 entries the oldest one is
-- dropped and counted. What is stored is 0014's format, {"truncated": n,
-- "entries": [...]}, each entry without its null members.
CREATE OR REPLACE FUNCTION {schema}.onceflow_history(
    h jsonb, p_kind text, p_owner uuid, p_step text DEFAULT NULL, p_error text DEFAULT NULL, p_definition text DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql VOLATILE AS $onceflow_history$
SELECT jsonb_build_object(
    'truncated', coalesce((h->>'truncated')::bigint, 0) + CASE WHEN jsonb_array_length(h->'entries') >= 50 THEN 1 ELSE 0 END,
    'entries', CASE WHEN jsonb_array_length(h->'entries') >= 50 THEN (h->'entries') - 0 ELSE coalesce(h->'entries', '[]') END
        || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object('at', clock_timestamp(), 'kind', p_kind, 'owner', p_owner,
            'step', p_step, 'error', left(p_error, 200), 'definition', p_definition))))
$onceflow_history$;
