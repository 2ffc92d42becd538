package workflow_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/workflow"
)

// TestDeriveKeysFromALostRecord: a record lost with the database (an
// asynchronous standby promoted before the record's commit reached it) is
// made again by the retry, with a new id. With DeriveKeysFrom record (the
// default) the retry's call goes out under a new downstream key; with
// client-key, under the first call's key, which a provider that honours
// keys answers without acting again.
func TestDeriveKeysFromALostRecord(t *testing.T) {
	for _, source := range []foreign.KeySource{foreign.FromRecord, foreign.FromClientKey} {
		t.Run(source.String(), func(t *testing.T) {
			w := newWorld(t)
			var sent []string
			wf := workflow.Define("lost_charge", foreign.Mutation("charge", func(_ context.Context, c *foreign.Call[Order, Paid]) error {
				sent = append(sent, c.Key, c.KeyFor("item-1"))
				return nil
			}))
			e := w.engine(workflow.Config{DeriveKeysFrom: source})
			first, err := wf.Run(w.ctx, e, acme, order)
			require.NoError(t, err)
			require.False(t, first.Replayed)

			// The failover loses the record; the client's retry makes it anew.
			lost, err := w.db.Exec(w.ctx, `DELETE FROM onceflow_keys WHERE tenant_id = $1 AND key = $2`, acme.Tenant, acme.ID)
			require.NoError(t, err)
			require.EqualValues(t, 1, lost.RowsAffected())
			again, err := wf.Run(w.ctx, e, acme, order)
			require.NoError(t, err)
			require.False(t, again.Replayed, "the record was lost: the retry runs the workflow again")

			require.Len(t, sent, 4)
			if source == foreign.FromClientKey {
				require.Equal(t, sent[:2], sent[2:], "the same downstream keys: the provider answers the retry from its memory")
			} else {
				require.NotEqual(t, sent[0], sent[2], "a new record, new downstream keys")
				require.NotEqual(t, sent[1], sent[3])
			}
			require.NotEqual(t, sent[0], sent[1], "KeyFor refines the step's key")
		})
	}
}

// TestDeriveKeysFromOutOfRange: NewEngine refuses a key source it does not
// know, rather than deriving keys some way nobody chose.
func TestDeriveKeysFromOutOfRange(t *testing.T) {
	w := newWorld(t)
	_, err := workflow.NewEngine(w.db, workflow.Config{DeriveKeysFrom: foreign.KeySource(7)})
	require.ErrorIs(t, err, workflow.ErrInvalidInput)
	require.ErrorContains(t, err, "KeySource(7)")
}
