package routing_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/routing"
)

func TestRoutedStatementsPass(t *testing.T) {
	t.Parallel()
	for name, sql := range map[string]string{
		"load":               `SELECT id, status FROM "public".onceflow_keys WHERE tenant_id = $1 AND key = $2`,
		"quoted schema":      `UPDATE "My Schema"."onceflow_keys" SET owner = $4 WHERE tenant_id = $1 AND key = $2 AND owner = $3`,
		"parameter first":    `DELETE FROM onceflow_keys WHERE $1::text = tenant_id AND key = $2`,
		"row comparison":     `SELECT 1 FROM onceflow_keys WHERE (tenant_id, key) = ($1, $2)`,
		"row list":           `SELECT 1 FROM onceflow_keys WHERE (tenant_id, key) IN (($1, $2))`,
		"insert":             `INSERT INTO "public".onceflow_keys AS k (tenant_id, key, id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
		"claim function":     `SELECT c.*, clock_timestamp() FROM "public".onceflow_claim($1::text, $2::text, $3::uuid) c`,
		"function body call": `PERFORM "public".onceflow_lock_key(p_tenant, p_key)`,
		"body read":          `SELECT * INTO existing FROM public.onceflow_keys k WHERE k.tenant_id = p_tenant AND k.key = p_key`,
		"takeover": `WITH existing AS (SELECT id FROM "public".onceflow_keys WHERE tenant_id = $1 AND key = $2),
			taken AS (SELECT id FROM "public".onceflow_take_over($1::text, $2::text, $6::text) )
			SELECT id FROM taken UNION ALL SELECT id FROM existing WHERE NOT EXISTS (SELECT 1 FROM taken)`,
		"fenced or fail": `WITH done AS (UPDATE "public".onceflow_keys SET state = $4 WHERE tenant_id = $1 AND key = $2 AND owner = $3
			AND (status = 'in_flight' OR status = 'parked') RETURNING 1)
			SELECT CASE WHEN EXISTS (SELECT 1 FROM done) THEN 1 ELSE "public".onceflow_lease_lost() END`,
		"or elsewhere":      `SELECT CASE WHEN a OR b THEN 1 END FROM onceflow_keys WHERE tenant_id = $1 AND (x OR y)`,
		"history in a set":  `UPDATE onceflow_keys SET history = onceflow_history(history, 'x', owner) WHERE tenant_id = $1 AND key = $2`,
		"business table":    `INSERT INTO orders (customer) VALUES ($1)`,
		"savepoint":         `savepoint onceflow_sp_1`,
		"declaration":       `DECLARE existing public.onceflow_keys`,
		"ddl":               `CREATE INDEX onceflow_keys_x_idx ON "public".onceflow_keys (created_at)`,
		"comment":           "-- reads from onceflow_keys\nSELECT 1 /* FROM onceflow_keys */",
		"string":            `SELECT 'FROM onceflow_keys', $$FROM onceflow_keys$$`,
		"coordinator table": `UPDATE "public".onceflow_outbox SET attempts = attempts + 1 WHERE status = 'pending'`,
		"reference table":   `SELECT spec FROM "public".onceflow_definitions WHERE workflow = $1`,
		"migration": `ALTER TABLE "public".onceflow_keys ADD COLUMN x int;
			DROP FUNCTION "public".onceflow_claim(text, text); -- a signature, not a call; a semicolon in a comment;
			CREATE FUNCTION "public".onceflow_claim(p_tenant text) RETURNS void LANGUAGE sql AS $f$ DELETE FROM onceflow_keys; $f$;
			DO $d$ BEGIN PERFORM 1; END $d$`,
	} {
		require.NoError(t, routing.Check(sql), name)
	}
}

func TestUnroutedStatementsFail(t *testing.T) {
	t.Parallel()
	for name, sql := range map[string]string{
		"key only":             `SELECT id FROM "public".onceflow_keys WHERE key = $2`,
		"quoted key only":      `SELECT id FROM "public"."onceflow_keys" WHERE "key" = $2`,
		"optional tenant":      `SELECT id FROM onceflow_keys WHERE ($1 = '' OR tenant_id = $1) AND key = $2`,
		"tenant or key":        `UPDATE onceflow_keys SET owner = $3 WHERE tenant_id = $1 OR key = $2`,
		"tenant any":           `SELECT id FROM onceflow_keys WHERE tenant_id = ANY($1)`,
		"tenant from a column": `SELECT id FROM onceflow_keys k WHERE k.tenant_id = k.key`,
		"second read": `SELECT id FROM onceflow_keys WHERE tenant_id = $1 AND key = $2
			UNION ALL SELECT id FROM onceflow_keys WHERE key = $2`,
		"insert without tenant": `INSERT INTO onceflow_keys SELECT * FROM staged`,
		"tenant in a comment":   "SELECT id FROM onceflow_keys WHERE key = $2 -- AND tenant_id = $1",
		"tenant in a string":    `SELECT id FROM onceflow_keys WHERE key = 'tenant_id = $1'`,
		"tenant not first":      `PERFORM onceflow_lock_key(p_key, p_tenant)`,
		"unknown table":         `SELECT * FROM "public".onceflow_widgets WHERE tenant_id = $1`,
		"unknown function":      `SELECT "public".onceflow_frobnicate($1)`,
		"join":                  `SELECT 1 FROM orders o JOIN onceflow_keys k ON k.key = o.key WHERE o.id = $1`,
		"dml after ddl":         `CREATE INDEX i ON onceflow_keys (x); UPDATE onceflow_keys SET x = 1`,
		"second statement":      `SELECT 1 FROM onceflow_keys WHERE tenant_id = $1; DELETE FROM onceflow_keys WHERE key = $2`,
	} {
		var v *routing.Violation
		require.ErrorAs(t, routing.Check(sql), &v, name)
	}
}

func TestMaintenanceScansAreListedByFragment(t *testing.T) {
	t.Parallel()
	prune := `
DELETE FROM "public".onceflow_keys WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM "public".onceflow_keys
    WHERE status IN ('completed', 'failed') AND completed_at < statement_timestamp() - $1::bigint * interval '1 microsecond'
    LIMIT $2 FOR UPDATE SKIP LOCKED))`
	require.Error(t, routing.Check(prune), "a maintenance scan does not route")
	scan := routing.Listed(prune)
	require.NotNil(t, scan)
	require.Equal(t, "sweeper.Pruner: finished and abandoned records", scan.Name)
	require.Nil(t, routing.Listed(`SELECT id FROM "public".onceflow_keys WHERE key = $2`))
	require.NotNil(t, routing.Listed(`UPDATE "public".onceflow_keys
		SET status = 'failed'   WHERE status = 'compensated'`), "white space and quotes do not matter")
	for _, s := range routing.Maintenance {
		require.NotEmpty(t, s.Name)
		require.NotEmpty(t, s.Why, s.Name)
		require.Equal(t, s.Fragment, strings.Join(strings.Fields(strings.ToLower(s.Fragment)), " "), "%s: fragments are lower case, single-spaced", s.Name)
	}
}
