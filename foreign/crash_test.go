package foreign_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/crashtest"
	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/testapp"
)

// A charge that fails once and is retried within the attempt survives a
// crash at every point, recovered by the client's retry and by the
// sweeper: one order, one ledger row and one charge at the provider, every
// call with one key. (Mutation caught: a key derived per try.)
func TestRetriedChargeSurvivesCrashes(t *testing.T) {
	t.Parallel()
	w := &waits{}
	crashtest.Run(t, crashtest.Case[testapp.Order, testapp.State]{
		NewWorld: func(ctx context.Context) (*crashtest.World[testapp.Order, testapp.State], error) {
			db := dbtest.Connect(t, dbtest.NewDatabase(t, dbtest.Options{}), 8)
			if _, err := db.Exec(ctx, testapp.Schema); err != nil {
				return nil, err
			}
			p := testapp.NewProvider(t)
			p.Fail("charges", status(503)) // each world's first charge
			checkout := testapp.Checkout(p.URL, testapp.Options{Charge: []foreign.Option{
				foreign.Retry{Max: 3}, foreign.WithSleep(w.sleep)}})
			return &crashtest.World[testapp.Order, testapp.State]{DB: db, Workflow: checkout, Close: db.Close,
				Check: func(ctx context.Context) error {
					var orders, ledger int
					if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM ledger)`).
						Scan(&orders, &ledger); err != nil {
						return err
					}
					keys := slices.Compact(p.Keys("charges"))
					if orders != 1 || ledger != 1 || p.Effects("charges") != 1 || len(keys) != 1 {
						return fmt.Errorf("%d orders, %d ledger rows, %d charges made, %d keys sent; want one each",
							orders, ledger, p.Effects("charges"), len(keys))
					}
					return nil
				}}, nil
		},
		Request: order,
		// A crash before create_order's commit skips the order id its
		// attempt drew from the sequence.
		SameResponse: crashtest.SameResponseExcept("order_id"),
	})
	require.NotEmpty(t, w.all(), "the charges were retried")
}
