package workflow_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// TestResumeStoresItsDefinition: a process that only resumes records (a
// completer right after a deploy, before any client's request) stores its
// definition before it stamps or parks a record under it, so that a later
// process can read it and an operator can resume a parked record as it.
func TestResumeStoresItsDefinition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.NewPool(t, 8)
	_, err := db.Exec(ctx, testapp.Schema)
	require.NoError(t, err)
	provider := testapp.NewProvider(t)
	v1 := testapp.Checkout(provider.URL, testapp.Options{})
	crashing, err := workflow.NewEngine(db, workflow.Config{Hooks: &workflow.Hooks{
		CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
			if p == (workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"}) {
				return errors.New("died")
			}
			return nil
		},
	}})
	require.NoError(t, err)
	noop := func(name string) phase.Step[Order, Paid] {
		return phase.Atomic(name, func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil })
	}
	for _, c := range []struct {
		key   string
		steps []phase.Step[Order, Paid]
		err   error
	}{
		{"parks", []phase.Step[Order, Paid]{noop("create_order"), noop("fraud_check"), noop("charge"), noop("record_charge")}, workflow.ErrParked},
		{"restamps", []phase.Step[Order, Paid]{noop("create_order"), phase.Foreign("charge", func(context.Context, *phase.Run[Order, Paid]) error {
			return nil
		}), noop("record_charge"), noop("audit")}, nil},
	} {
		key := workflow.Key{Tenant: "acme", ID: c.key}
		_, err := v1.Run(ctx, crashing, key, Order{Amount: 1})
		require.ErrorIs(t, err, workflow.ErrCrashed)
		_, err = db.Exec(ctx, `UPDATE onceflow_keys SET locked_until = clock_timestamp() - interval '1 second' WHERE key = $1`, c.key)
		require.NoError(t, err)

		v2 := workflow.Define("checkout", c.steps...).Version(c.key)
		e, err := workflow.NewEngine(db, workflow.Config{Workflows: []workflow.Definition{v2}})
		require.NoError(t, err)
		_, err = e.Resume(ctx, key)
		if c.err != nil {
			require.ErrorIs(t, err, c.err, c.key)
		} else {
			require.NoError(t, err, c.key)
		}
		defs, err := e.Store().Definitions(ctx, "checkout", v2.Spec().Fingerprint)
		require.NoError(t, err)
		require.Len(t, defs, 1, "%s: the resuming definition is stored", c.key)
		require.Equal(t, c.key, defs[0].Version)
	}
}

// TestSlowDefinitionSaveDoesNotFailARun: storing a definition slower than
// Config.DBTimeout (a loaded server, a pool still connecting) fails no
// run. The definition is stored once, off the runs' clocks; runs that
// arrive meanwhile wait for it, bounded by their own contexts, and then
// claim within DBTimeout as ever.
//
// Before, each run stored the definition itself within its DBTimeout: the
// first runs of a process on a busy machine failed with ErrUnavailable
// ("store definition of checkout: ... context deadline exceeded").
func TestSlowDefinitionSaveDoesNotFailARun(t *testing.T) {
	w := newWorld(t)
	const dbTimeout = 2 * time.Second
	var tries atomic.Int32
	e := w.engine(workflow.Config{DBTimeout: dbTimeout, Hooks: &workflow.Hooks{
		SavingDefinition: func(ctx context.Context, _, _ string) error {
			if tries.Add(1) > 1 {
				return nil
			}
			select {
			case <-ctx.Done(): // a save bounded by a run's DBTimeout ends here
				return context.Cause(ctx)
			case <-time.After(2 * dbTimeout): // a server slower than DBTimeout
				return nil
			}
		},
	}})
	wf := w.checkout()
	const runs = 4
	errs := make(chan error, runs)
	for i := range runs {
		go func() {
			_, err := wf.Run(w.ctx, e, workflow.Key{Tenant: "acme", ID: fmt.Sprintf("slow-%d", i)}, order)
			errs <- err
		}()
	}
	for range runs {
		require.NoError(t, <-errs)
	}
	require.EqualValues(t, 1, tries.Load(), "one save for every run")
	require.Equal(t, runs, w.orders())
}

// TestEngineStoresItsDefinitionsWhenBuilt: NewEngine stores the
// definitions of Config.Workflows in the background, before any run, and
// SaveDefinitions waits for that save instead of making another.
func TestEngineStoresItsDefinitionsWhenBuilt(t *testing.T) {
	w := newWorld(t)
	saving := make(chan string, 1)
	wf := w.checkout()
	e := w.engine(workflow.Config{Workflows: []workflow.Definition{wf}, Hooks: &workflow.Hooks{
		SavingDefinition: func(_ context.Context, workflow, _ string) error {
			saving <- workflow
			return nil
		},
	}})
	select {
	case name := <-saving:
		require.Equal(t, wf.Name(), name)
	case <-time.After(30 * time.Second):
		require.Fail(t, "NewEngine started no save of its definitions")
	}
	require.NoError(t, e.SaveDefinitions(w.ctx))
	require.Empty(t, saving, "SaveDefinitions waited for the save under way")
	defs, err := e.Store().Definitions(w.ctx, wf.Name(), wf.Spec().Fingerprint)
	require.NoError(t, err)
	require.Len(t, defs, 1)
}

// TestDefinitionSaveIsTriedAgain: a save of a definition that fails is
// tried again, with a warning, and the run that waits for it goes on;
// once every try failed, the runs waiting get the error, and the next run
// starts another save.
func TestDefinitionSaveIsTriedAgain(t *testing.T) {
	w := newWorld(t)
	var (
		tries atomic.Int32
		fails atomic.Int32 // tries still to fail
		logs  bytes.Buffer
		mu    sync.Mutex
	)
	refused := errors.New("connection reset by peer")
	fails.Store(1)
	e := w.engine(workflow.Config{
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil)),
		Hooks: &workflow.Hooks{SavingDefinition: func(context.Context, string, string) error {
			tries.Add(1)
			if fails.Add(-1) >= 0 {
				return refused
			}
			return nil
		}},
	})
	wf := w.checkout()
	_, err := wf.Run(w.ctx, e, acme, order)
	require.NoError(t, err, "the second try stored it")
	require.EqualValues(t, 2, tries.Load())
	mu.Lock()
	require.Contains(t, logs.String(), "connection reset by peer")
	mu.Unlock()

	other := workflow.Define("other", atomicStep("only", func(context.Context, pgx.Tx, *phase.Run[Order, Paid]) error { return nil }))
	fails.Store(1 << 20)
	tries.Store(0)
	_, err = other.Run(w.ctx, e, workflow.Key{Tenant: "acme", ID: "other"}, order)
	require.ErrorIs(t, err, refused, "every try failed")
	spent := tries.Load()
	require.Greater(t, spent, int32(1), "tried again")
	_, err = other.Run(w.ctx, e, workflow.Key{Tenant: "acme", ID: "other"}, order)
	require.ErrorIs(t, err, refused)
	require.Equal(t, 2*spent, tries.Load(), "the next run started another save")
	fails.Store(0)
	_, err = other.Run(w.ctx, e, workflow.Key{Tenant: "acme", ID: "other"}, order)
	require.NoError(t, err)
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
