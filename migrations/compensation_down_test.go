package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/migrations"
)

// TestDownRefusedWhileARecordIsCompensating: migration 0012's down drops
// the list of steps still to undo. A record in flight or parked with steps
// left to undo would come back, under a build before compensation, as a
// record to run forward from its recovery point, after its failure was
// decided and part of its effects undone: down refuses while one exists,
// whether it is running (in flight) or waits for an operator (parked).
// Finished records lose nothing a build before compensation could use: a
// compensated one becomes failed.
func TestDownRefusedWhileARecordIsCompensating(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, status := range []string{"in_flight", "parked"} {
		t.Run(status, func(t *testing.T) {
			t.Parallel()
			db := newEmpty(t)
			m, err := migrations.New(db, migrations.Config{})
			require.NoError(t, err)
			_, err = m.Up(ctx)
			require.NoError(t, err)
			_, err = db.Exec(ctx, `INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, owner, status,
				locked_until, recovery_point, undo, response_status)
			VALUES ('t', 'k', gen_random_uuid(), 'saga', sha256('x'), gen_random_uuid(), $1,
				CASE WHEN $1 = 'in_flight' THEN clock_timestamp() END, 'charge', '{charge,reserve}', 500)`, status)
			require.NoError(t, err)
			_, err = db.Exec(ctx, `INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, owner, status,
				response_status, undo, completed_at)
			VALUES ('t', 'done', gen_random_uuid(), 'saga', sha256('x'), gen_random_uuid(), 'compensated', 500, '{}', now())`)
			require.NoError(t, err)

			_, err = m.To(ctx, 11)
			require.ErrorContains(t, err, "still compensating")
			version, err := m.Version(ctx)
			require.NoError(t, err)
			require.Equal(t, 12, version, "nothing reverted")

			_, err = db.Exec(ctx, `UPDATE onceflow_keys SET status = 'failed', locked_until = NULL, completed_at = now() WHERE key = 'k'`)
			require.NoError(t, err)
			_, err = m.To(ctx, 11)
			require.NoError(t, err, "a record that failed with steps left to undo does not hold the migration back")
			var finished string
			require.NoError(t, db.QueryRow(ctx, `SELECT status FROM onceflow_keys WHERE key = 'done'`).Scan(&finished))
			require.Equal(t, "failed", finished)
		})
	}
}
