package workflow_test

// The stored request is the request as encoding/json wrote it, so a resume
// reads back what the first attempt had; one that could not be read back is
// refused before anything is stored.

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// bigOrder holds integers past what the canonical form writes in full (21
// digits): a *big.Int, which reads only digits, and a json.Number, which
// reads an exponent too but keeps its text; and a uint64 at its largest.
type bigOrder struct {
	Amount *big.Int    `json:"amount"`
	Raw    json.Number `json:"raw"`
	Max    uint64      `json:"max"`
}

var hugeOrder = bigOrder{Amount: new(big.Int).Exp(big.NewInt(10), big.NewInt(30), nil), Raw: "1000000000000000000000000000000000000000",
	Max: math.MaxUint64}

// bigFlow is charge (foreign) → record (atomic); each step notes the
// request it was given in seen.
func bigFlow(w *world, mu *sync.Mutex, seen *[]bigOrder) *workflow.Workflow[bigOrder, Paid] {
	note := func(r bigOrder) {
		mu.Lock()
		defer mu.Unlock()
		*seen = append(*seen, r)
	}
	return workflow.Define("big",
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[bigOrder, Paid]) error {
			note(c.Request)
			id, err := testapp.Call(ctx, w.provider.URL, "charges", c.Key)
			c.State.ChargeID = id
			return err
		}),
		phase.Atomic("record", func(_ context.Context, _ pgx.Tx, r *phase.Run[bigOrder, Paid]) error {
			note(r.Request)
			return nil
		}),
	)
}

// TestResumeReadsBackARequestOfHugeIntegers: the client's process dies
// after the charge, and Resume (the completer's path) finishes the record
// from the stored request. It reads the request the first attempt had: a
// *big.Int of 31 digits (which the canonical form, 1e+30, would not give
// back), a json.Number with the same text, and the largest uint64.
func TestResumeReadsBackARequestOfHugeIntegers(t *testing.T) {
	w := newWorld(t)
	var (
		mu   sync.Mutex
		seen []bigOrder
	)
	wf := bigFlow(w, &mu, &seen)
	w.crashIn(wf, func(e *workflow.Engine) error { _, err := wf.Run(w.ctx, e, acme, hugeOrder); return err },
		workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"}, acme)

	res, err := w.engine(workflow.Config{Workflows: []workflow.Definition{wf}}).Resume(w.ctx, acme)
	require.NoError(t, err)
	require.False(t, res.Failed)
	require.Equal(t, 1, w.provider.Effects("charges"))
	require.Len(t, seen, 3, "charge, charge again on resume, record")
	for _, r := range seen {
		require.Zero(t, hugeOrder.Amount.Cmp(r.Amount), "amount %s", r.Amount)
		require.Equal(t, hugeOrder.Raw, r.Raw)
		require.Equal(t, hugeOrder.Max, r.Max)
	}

	// The client's retry gets the stored answer: the fingerprint is still
	// over the canonical form.
	again, err := wf.Run(w.ctx, w.engine(workflow.Config{}), acme, hugeOrder)
	require.NoError(t, err)
	require.True(t, again.Replayed)
}

// oneWay is a request whose JSON does not decode back: its MarshalJSON
// writes a string its UnmarshalJSON refuses.
type oneWay struct{ N int }

func (o oneWay) MarshalJSON() ([]byte, error) { return json.Marshal("n") }
func (o *oneWay) UnmarshalJSON([]byte) error  { return errors.New("oneWay reads nothing") }

// TestRunRefusesARequestThatDoesNotDecodeBack: a request no resume could
// read is refused with ErrInvalidInput before a record is made, rather than
// accepted and lost once its client is gone.
func TestRunRefusesARequestThatDoesNotDecodeBack(t *testing.T) {
	w := newWorld(t)
	ran := false
	wf := workflow.Define("one_way", phase.Atomic("a", func(context.Context, pgx.Tx, *phase.Run[oneWay, Paid]) error {
		ran = true
		return nil
	}))
	_, err := wf.Run(w.ctx, w.engine(workflow.Config{}), acme, oneWay{N: 1})
	require.ErrorIs(t, err, workflow.ErrInvalidInput)
	require.ErrorContains(t, err, "does not decode back")
	require.False(t, ran)
	require.Zero(t, w.keys())
}
