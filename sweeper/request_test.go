package sweeper_test

import (
	"context"
	"errors"
	"math/big"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/sweeper"
	"github.com/onceflow/onceflow/workflow"
)

// bigTransfer is a request of an integer past 21 digits, which the
// canonical form writes with an exponent that a *big.Int does not read.
type bigTransfer struct {
	Amount *big.Int `json:"amount"`
}

// TestCompleterResumesARequestOfHugeIntegers: a transfer's process dies
// after its call; the completer finishes it from the stored request, which
// gives back the amount the call was made with.
func TestCompleterResumesARequestOfHugeIntegers(t *testing.T) {
	b := setup(t)
	var (
		mu      sync.Mutex
		amounts []string
	)
	transfer := workflow.Define("transfer",
		foreign.Mutation("send", func(ctx context.Context, c *foreign.Call[bigTransfer, State]) error {
			mu.Lock()
			amounts = append(amounts, c.Request.Amount.String())
			mu.Unlock()
			_, err := testapp.Call(ctx, b.provider.URL, "transfers", c.Key)
			return err
		}),
		phase.Atomic("record", func(context.Context, pgx.Tx, *phase.Run[bigTransfer, State]) error { return nil }),
	)
	crashing, err := workflow.NewEngine(b.db, workflow.Config{Hooks: &workflow.Hooks{
		CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
			if p == (workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "send"}) {
				return errors.New("died")
			}
			return nil
		},
	}})
	require.NoError(t, err)
	key := workflow.Key{Tenant: "acme", ID: "transfer-1"}
	amount, ok := new(big.Int).SetString("1000000000000000000000000000001", 10)
	require.True(t, ok)
	_, err = transfer.Run(b.ctx, crashing, key, bigTransfer{Amount: amount})
	require.ErrorIs(t, err, workflow.ErrCrashed)
	_, err = b.db.Exec(b.ctx, `UPDATE onceflow_keys SET locked_until = clock_timestamp() - interval '1 second' WHERE tenant_id = $1 AND key = $2`,
		key.Tenant, key.ID)
	require.NoError(t, err)

	engine, err := workflow.NewEngine(b.db, workflow.Config{Workflows: []workflow.Definition{transfer}})
	require.NoError(t, err)
	completer, err := sweeper.NewCompleter(b.db, engine, sweeper.CompleterConfig{BackoffBase: -1}) // due at once
	require.NoError(t, err)
	require.NoError(t, completer.Run(b.ctx))
	rec, err := engine.Store().Load(b.ctx, key)
	require.NoError(t, err)
	require.Equal(t, recovery.StatusCompleted, rec.Status, "last error: %s", rec.LastError)
	require.Equal(t, []string{amount.String(), amount.String()}, amounts)
	require.Equal(t, 1, b.provider.Effects("transfers"))
}
