package sweeper_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/sweeper"
)

// TestCompleterReportsTheOldestStuckRecordPerWorkflow: a record in flight
// that no attempt holds is stuck, its age counted from its creation, per
// workflow; a record whose lease is held is not, nor is a parked one
// (onceflow_parked_records counts those); and a workflow whose stuck
// records are gone is reported at 0.
func TestCompleterReportsTheOldestStuckRecordPerWorkflow(t *testing.T) {
	b := setup(t)
	insert := func(key, workflow, status string, lockedUntil any, createdAgo string) {
		t.Helper()
		_, err := b.db.Exec(b.ctx, `INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, owner, status, locked_until, created_at)
			VALUES ('acme', $1, gen_random_uuid(), $2, decode(repeat('00', 32), 'hex'), gen_random_uuid(), $3,
				clock_timestamp() + $4::interval, clock_timestamp() - $5::interval)`, key, workflow, status, lockedUntil, createdAgo)
		require.NoError(t, err)
	}
	insert("old", "ship", "in_flight", "-1 minute", "3 hours")      // its process stopped
	insert("young", "ship", "in_flight", "-1 second", "1 hour")     // handed back: stuck, but younger
	insert("held", "bill", "in_flight", "1 hour", "5 hours")        // an attempt holds it
	insert("parked", "bill", "parked", nil, "9 hours")              // waits for an operator
	insert("waits", "pack", "in_flight", "-1 minute", "10 minutes") // stuck, and soon done
	obs := newRecorder()
	reporter, err := sweeper.NewCompleter(b.db, nil, sweeper.CompleterConfig{Observer: obs})
	require.NoError(t, err)

	require.NoError(t, reporter.Run(b.ctx))
	ship := obs.stuckNow("ship")
	require.GreaterOrEqual(t, ship, 3*time.Hour)
	require.Less(t, ship, 3*time.Hour+time.Minute, "the oldest, not the youngest or a sum")
	require.GreaterOrEqual(t, obs.stuckNow("pack"), 10*time.Minute)
	require.Equal(t, time.Duration(-1), obs.stuckNow("bill"), "a held or parked record is not stuck")

	// A retry takes it over.
	_, err = b.db.Exec(b.ctx, `UPDATE onceflow_keys SET locked_until = clock_timestamp() + interval '1 hour' WHERE key = 'waits'`)
	require.NoError(t, err)
	require.NoError(t, reporter.Run(b.ctx))
	require.Zero(t, obs.stuckNow("pack"), "none left: the gauge says 0")
	require.GreaterOrEqual(t, obs.stuckNow("ship"), 3*time.Hour)
}
