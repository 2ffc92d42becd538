package sweeper_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/workflow"
)

func TestMain(m *testing.M) {
	if os.Getenv("SWEEPER_HELPER") != "" {
		os.Exit(helperMain())
	}
	dbtest.Main(m)
}

// Order and State are the shared test checkout's.
type (
	Order = testapp.Order
	State = testapp.State
)

// checkout is the shared test checkout, charging through the provider at
// providerURL.
func checkout(providerURL string) *workflow.Workflow[Order, State] {
	return testapp.Checkout(providerURL, testapp.Options{})
}

type bundle struct {
	ctx      context.Context
	url      string
	db       *pgxpool.Pool
	provider *testapp.Provider
	checkout *workflow.Workflow[Order, State]
}

func setup(t *testing.T) *bundle {
	t.Helper()
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	b := &bundle{ctx: context.Background(), url: url, db: dbtest.Connect(t, url, 16), provider: testapp.NewProvider(t)}
	// One order per key, as well: a step run twice fails instead of
	// going unnoticed.
	_, err := b.db.Exec(b.ctx, testapp.Schema+`; CREATE UNIQUE INDEX ON orders (tenant, key)`)
	require.NoError(t, err)
	b.checkout = checkout(b.provider.URL)
	return b
}

// abandon runs n checkouts of tenant acme that each stop right after the
// charge, as a process death would, and ends their leases.
func (b *bundle) abandon(t *testing.T, n int) []workflow.Key {
	t.Helper()
	return b.abandonIn(t, "acme", n)
}

// abandonIn is abandon for tenant's checkouts; it ends their leases only.
func (b *bundle) abandonIn(t *testing.T, tenant string, n int) []workflow.Key {
	t.Helper()
	e, err := workflow.NewEngine(b.db, workflow.Config{Hooks: &workflow.Hooks{
		CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
			if p == (workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"}) {
				return fmt.Errorf("died")
			}
			return nil
		},
	}})
	require.NoError(t, err)
	keys := make([]workflow.Key, n)
	for i := range n {
		keys[i] = workflow.Key{Tenant: tenant, ID: fmt.Sprintf("abandoned-%03d", i)}
		_, err := b.checkout.Run(b.ctx, e, keys[i], Order{Amount: int64(100 + i)})
		require.ErrorIs(t, err, workflow.ErrCrashed)
	}
	_, err = b.db.Exec(b.ctx, `UPDATE onceflow_keys SET locked_until = clock_timestamp() - interval '1 second'
		WHERE tenant_id = $1`, tenant)
	require.NoError(t, err)
	return keys
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(b.ctx, sql, args...).Scan(&n))
	return n
}

// recorder is an Observer that keeps what it hears.
type recorder struct {
	mu        sync.Mutex
	runs      map[string]int
	pruned    map[string]int
	resumed   map[string]int
	attempted map[string]int // every Resumed, whatever its error
	abandoned map[string]int
	parked    map[string]int
	oldest    time.Duration
	stuck     map[string]time.Duration
	ran       chan string
}

func newRecorder() *recorder {
	return &recorder{runs: map[string]int{}, pruned: map[string]int{}, resumed: map[string]int{}, attempted: map[string]int{},
		abandoned: map[string]int{}, parked: map[string]int{}, stuck: map[string]time.Duration{}, ran: make(chan string, 100)}
}

func (r *recorder) TaskRan(task string, _ time.Duration, _ error) {
	r.mu.Lock()
	r.runs[task]++
	r.mu.Unlock()
	select {
	case r.ran <- task:
	default:
	}
}

func (r *recorder) Pruned(table string, rows int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pruned[table] += rows
}

func (r *recorder) Resumed(workflow string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempted[workflow]++
	if err == nil {
		r.resumed[workflow]++
	}
}

func (r *recorder) Abandoned(workflow string, records int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.abandoned[workflow] = records
}

func (r *recorder) ParkedRecords(workflow string, records int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.parked[workflow] = records
}

// parkedNow is the count of parked records of workflow last reported; -1
// when none was.
func (r *recorder) parkedNow(workflow string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.parked[workflow]
	if !ok {
		return -1
	}
	return n
}

func (r *recorder) OldestStuck(workflow string, age time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stuck[workflow] = age
}

// stuckNow is the age of workflow's oldest stuck record last reported; -1
// when none was.
func (r *recorder) stuckNow(workflow string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	age, ok := r.stuck[workflow]
	if !ok {
		return -1
	}
	return age
}

func (r *recorder) OldestInFlight(age time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.oldest = age
}
