package workflow_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

func TestDefineRejectsBrokenDefinitions(t *testing.T) {
	t.Parallel()
	ok := foreignStep("a", nil)
	cases := map[string]func(){
		"no steps":        func() { workflow.Define[Order, Paid]("empty") },
		"no name":         func() { workflow.Define("", ok) },
		"duplicate steps": func() { workflow.Define("dup", ok, foreignStep("a", nil)) },
		"bad step name":   func() { workflow.Define("w", foreignStep("bad\nname", nil)) },
		"no function":     func() { workflow.Define("w", phase.Atomic[Order, Paid]("a", nil)) },
	}
	for name, define := range cases {
		require.Panics(t, define, name)
	}
	require.NotPanics(t, func() { workflow.Define("fine", ok, foreignStep("b", nil)) })
}

func TestCrashPointsFollowTheDefinition(t *testing.T) {
	t.Parallel()
	noop := func() error { return nil }
	write := func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil }
	wf := workflow.Define("w",
		atomicStep("a1", write), foreignStep("f1", noop), atomicStep("a2", write),
		foreignStep("f2", noop), foreignStep("f3", noop))
	var got []string
	for _, p := range workflow.CrashPoints(wf) {
		got = append(got, p.String())
	}
	require.Equal(t, []string{
		"before a1", "before a1's commit", "after a1's commit",
		"before f1", "after f1's call", // f1's result commits with a2
		"before a2", "before a2's commit", "after a2's commit",
		"before f2", "after f2's call", "after f2's commit", // f3 follows: f2 commits alone
		"before f3", "after f3's call", "after f3's commit",
	}, got)
	require.Equal(t, []workflow.StepInfo{
		{Name: "a1", Kind: phase.KindAtomic}, {Name: "f1", Kind: phase.KindForeign}, {Name: "a2", Kind: phase.KindAtomic},
		{Name: "f2", Kind: phase.KindForeign}, {Name: "f3", Kind: phase.KindForeign},
	}, wf.Steps())
}

func TestKeyOf(t *testing.T) {
	t.Parallel()
	require.Equal(t, workflow.Key{Tenant: "acme", ID: "order:42:capture"}, workflow.KeyOf("acme", "order", "42", "capture"))
	require.NotEqual(t, workflow.KeyOf("acme", "a:b", "c"), workflow.KeyOf("acme", "a", "b:c"), "parts never run together")
	require.NoError(t, workflow.KeyOf("acme", "order", "42 / ü").Validate())

	hashed := workflow.HashedKeyOf("acme", "jane@example.com", "refund")
	require.Equal(t, hashed, workflow.HashedKeyOf("acme", "jane@example.com", "refund"))
	require.NotContains(t, hashed.ID, "jane")
	require.Len(t, hashed.ID, 66)
	require.NotEqual(t, hashed, workflow.HashedKeyOf("acme", "jane@example.co", "mrefund"))
}

// TestDerivedKeysThroughTheEngine: a step's downstream key is stable across
// takeovers, differs between tenants, and changes when a key is reused after
// its record is gone.
func TestDerivedKeysThroughTheEngine(t *testing.T) {
	w := newWorld(t)
	var keys []string
	var subKeys []string
	wf := workflow.Define("keys",
		foreign.Mutation("pay", func(ctx context.Context, c *foreign.Call[Order, Paid]) error {
			keys = append(keys, c.Key)
			subKeys = append(subKeys, c.KeyFor("item", "1"), c.KeyFor("item", "2"))
			if len(keys) == 1 {
				return fmt.Errorf("first attempt fails after calling out")
			}
			return nil
		}),
	)
	e := w.engine(workflow.Config{})
	_, err := wf.Run(w.ctx, e, acme, order)
	require.Error(t, err)
	_, err = wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.Len(t, keys, 2)
	require.Equal(t, keys[0], keys[1], "the retry derived the same key")
	require.Equal(t, subKeys[0:2], subKeys[2:4], "and the same sub-keys")
	require.NotEqual(t, subKeys[0], subKeys[1])

	_, err = wf.Run(w.ctx, e, workflow.Key{Tenant: "globex", ID: acme.ID}, order)
	require.NoError(t, err)
	require.NotEqual(t, keys[0], keys[2], "another tenant, another key")

	_, err = w.db.Exec(w.ctx, `DELETE FROM onceflow_keys WHERE tenant_id = 'acme'`) // pruned
	require.NoError(t, err)
	_, err = wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err)
	require.NotEqual(t, keys[0], keys[3], "a key reused after pruning is a new intent")
}
