package sweeper_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

func TestMain(m *testing.M) {
	if os.Getenv("SWEEPER_HELPER") != "" {
		os.Exit(helperMain())
	}
	dbtest.Main(m)
}

type Order struct {
	Amount int64 `json:"amount"`
}

type State struct {
	OrderID  int64  `json:"order_id"`
	ChargeID string `json:"charge_id,omitempty"`
}

// checkout writes an order, charges it through the provider at
// providerURL, and records the charge.
func checkout(providerURL string) *workflow.Workflow[Order, State] {
	return workflow.Define("checkout",
		phase.Atomic("create_order", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, State]) error {
			return tx.QueryRow(ctx, `INSERT INTO orders (tenant, key, amount) VALUES ($1, $2, $3) RETURNING id`,
				r.Key.Tenant, r.Key.ID, r.Request.Amount).Scan(&r.State.OrderID)
		}),
		foreign.Mutation("charge", func(ctx context.Context, c *foreign.Call[Order, State]) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, providerURL+"/charges", nil)
			if err != nil {
				return err
			}
			foreign.SetHeader(req, c.Key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			return json.NewDecoder(resp.Body).Decode(&struct {
				ID *string `json:"id"`
			}{&c.State.ChargeID})
		}),
		phase.Atomic("record_charge", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, State]) error {
			_, err := tx.Exec(ctx, `UPDATE orders SET charge_id = $2 WHERE id = $1`, r.State.OrderID, r.State.ChargeID)
			return err
		}),
	).Finish(func(s *State) workflow.Response { return workflow.JSON(201, s) })
}

// provider is a payment service over HTTP that deduplicates by key and
// counts calls per key.
type provider struct {
	*httptest.Server
	mu    sync.Mutex
	calls map[string]int
}

func newProvider(t *testing.T) *provider {
	p := &provider{calls: map[string]int{}}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(foreign.Header)
		p.mu.Lock()
		p.calls[key]++
		p.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]string{"id": "ch_" + key[len(key)-8:]})
	}))
	t.Cleanup(p.Close)
	return p
}

func (p *provider) effects() (keys int, maxCalls int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.calls {
		maxCalls = max(maxCalls, n)
	}
	return len(p.calls), maxCalls
}

type bundle struct {
	ctx      context.Context
	url      string
	db       *pgxpool.Pool
	provider *provider
	checkout *workflow.Workflow[Order, State]
}

func setup(t *testing.T) *bundle {
	t.Helper()
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	b := &bundle{ctx: context.Background(), url: url, db: dbtest.Connect(t, url, 16), provider: newProvider(t)}
	_, err := b.db.Exec(b.ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, tenant text NOT NULL, key text NOT NULL,
		amount bigint NOT NULL, charge_id text, UNIQUE (tenant, key))`)
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
		_, err := e.Run(b.ctx, keys[i], b.checkout, Order{Amount: int64(100 + i)})
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
	abandoned map[string]int
	oldest    time.Duration
	ran       chan string
}

func newRecorder() *recorder {
	return &recorder{runs: map[string]int{}, pruned: map[string]int{}, resumed: map[string]int{},
		abandoned: map[string]int{}, ran: make(chan string, 100)}
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
	if err == nil {
		r.resumed[workflow]++
	}
}

func (r *recorder) Abandoned(workflow string, records int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.abandoned[workflow] = records
}

func (r *recorder) OldestInFlight(age time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.oldest = age
}
