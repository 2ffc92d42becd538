package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// TestKeysShowDeferred: keys show prints a deferred key's not-before time,
// in its table and its JSON; keys release ends the deferral, and the key
// shows none after.
func TestKeysShowDeferred(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	db := "--database-url=" + url
	pool := dbtest.Connect(t, url, 4)
	wf := workflow.Define("checkout",
		phase.Atomic("create_order", func(context.Context, pgx.Tx, *phase.Run[int, int]) error { return nil }),
		phase.Atomic("charge", func(context.Context, pgx.Tx, *phase.Run[int, int]) error {
			return phase.Defer(time.Hour, errors.New("provider answered 429"))
		}),
	)
	e, err := workflow.NewEngine(pool, workflow.Config{})
	require.NoError(t, err)
	key := workflow.Key{Tenant: "acme", ID: "order-1"}
	_, err = wf.Run(ctx, e, key, 1)
	var deferErr *phase.DeferError
	require.ErrorAs(t, err, &deferErr)
	rec, err := e.Store().Load(ctx, key)
	require.NoError(t, err)
	require.False(t, rec.NotBefore.IsZero())

	shown := ok(t, "keys", "show", "acme", "order-1", db)
	m := regexp.MustCompile(`(?m)^not before\s+(\S+) \(deferred by its last attempt\)$`).FindStringSubmatch(shown)
	require.NotNil(t, m, shown)
	printed, err := time.Parse(time.RFC3339Nano, m[1])
	require.NoError(t, err)
	require.True(t, printed.Equal(rec.NotBefore), "printed %s, stored %s", printed, rec.NotBefore)
	require.Regexp(t, `(?m)^lease\s+released$`, shown)
	var asJSON struct {
		NotBefore *time.Time `json:"not_before"`
	}
	require.NoError(t, json.Unmarshal([]byte(ok(t, "keys", "show", "acme", "order-1", "--json", db)), &asJSON))
	require.NotNil(t, asJSON.NotBefore)
	require.True(t, asJSON.NotBefore.Equal(rec.NotBefore))

	ok(t, "keys", "release", "acme", "order-1", db)
	require.NotContains(t, ok(t, "keys", "show", "acme", "order-1", db), "not before")
	released, err := e.Store().Load(ctx, key)
	require.NoError(t, err)
	require.Zero(t, released.NotBefore)
	require.Equal(t, recovery.StatusInFlight, released.Status)
}
