-- Back to 0014: onceflow_history in PL/pgSQL.
CREATE OR REPLACE FUNCTION {schema}.onceflow_history(
    h jsonb, p_kind text, p_owner uuid, p_step text DEFAULT NULL, p_error text DEFAULT NULL, p_definition text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS $onceflow_history$
DECLARE
    entries jsonb := coalesce(h->'entries', '[]') || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
        'at', clock_timestamp(), 'kind', p_kind, 'owner', p_owner, 'step', p_step,
        'error', left(p_error, 200), 'definition', p_definition)));
    truncated bigint := coalesce((h->>'truncated')::bigint, 0);
    n int := jsonb_array_length(entries);
BEGIN
    IF n > 50 THEN
        entries := jsonb_path_query_array(entries, '$[last - 49 to last]');
        truncated := truncated + n - 50;
    END IF;
    RETURN jsonb_build_object('truncated', truncated, 'entries', entries);
END
$onceflow_history$;
