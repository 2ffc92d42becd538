package main

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemclient"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/frontproxy"
)

// TestStormOfRestarts: 200 checkouts, 32 at once, each one intent under its
// own key through one idemclient.Client, while the checkout server behind a
// balancer is killed (SIGKILL) once and stopped (SIGTERM) once, and started
// again each time. Every intent ends with exactly one order and one charge,
// under its own key, none missing once load has re-driven those the retry
// budget refused; and the client sent no more requests than its budget
// allows: (1 + Ratio) × (intents + re-drives) + Burst.
//
// The restarts follow the load: the kill once 40 intents have been sent,
// the stop once 110 have; intents 80 to 149 start only once the second
// server listens, and the others once the third does, so that every server
// has intents in flight.
func TestStormOfRestarts(t *testing.T) {
	e := newEnv(t)
	const (
		intents, concurrency = 200, 32
		killAt, stopAt       = 40, 110 // intents sent
		secondFrom, thirdAt  = 80, 150 // intents held until the next server listens
	)
	lease := 2 * time.Second
	budget := idemclient.BudgetConfig{Ratio: 0.1, Burst: 10}
	args := []string{"--lease", lease.String(), "--sweep-every", lease.String()}
	// The balancer: the clients' URL stays while the server behind it
	// restarts on another port. While the server is down, it answers 502,
	// which the clients retry.
	lb := frontproxy.New(t, frontproxy.Config{MaxIdleConns: concurrency})
	first := e.serve(args...)
	require.NoError(t, lb.Route(first.URL))

	var sent atomic.Int64
	kill, stop := make(chan struct{}), make(chan struct{})
	second, third := make(chan struct{}), make(chan struct{})
	ctx, cancel := context.WithTimeout(e.ctx, 60*lease)
	defer cancel()
	cfg := loadConfig{URL: lb.URL, APIKey: apiKeyOf("acme"), Intents: intents, Concurrency: concurrency, Redrive: true,
		Client: idemclient.Config{
			Wait:       3 * lease, // longer than a killed server's lease, which holds its keys
			MaxElapsed: 20 * lease,
			Budget:     budget,
			Hooks: idemclient.Hooks{Attempt: func(a idemclient.AttemptInfo) {
				if a.Attempt > 1 {
					return
				}
				switch sent.Add(1) {
				case killAt:
					close(kill)
				case stopAt:
					close(stop)
				}
			}},
		},
		beforeIntent: func(ctx context.Context, i int) {
			for _, gate := range []struct {
				from int
				open chan struct{}
			}{{secondFrom, second}, {thirdAt, third}} {
				if i >= gate.from {
					select {
					case <-gate.open:
					case <-ctx.Done():
					}
				}
			}
		},
	}
	done := make(chan loadReport, 1)
	go func() {
		report, err := runLoad(ctx, cfg)
		if err != nil {
			t.Error(err)
		}
		done <- report
	}()

	await := func(event chan struct{}, what string) {
		t.Helper()
		select {
		case <-event:
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, ctx.Err())
		}
	}
	await(kill, "the first intents")
	first.Kill()
	first.Wait()
	next := e.serve(args...)
	require.NoError(t, lb.Route(next.URL))
	close(second)
	await(stop, "the intents of the second server")
	next.Stop()
	require.NoError(t, lb.Route(e.serve(args...).URL))
	close(third)
	report := <-done

	t.Logf("storm: %d requests at the balancer, %d attempts, %d retries, %d budget refusals, %d re-drives in %d rounds, %d replays, %dms",
		lb.Requests(), report.Attempts, report.Retries, report.BudgetRefusals, report.Redrives, report.RedriveRounds,
		report.Replays, report.ElapsedMS)
	require.False(t, report.Interrupted)
	require.Equal(t, intents, report.Succeeded, "every intent succeeded, after its re-drives: %+v", report)
	// The budget: the bound is exact. The balancer never restarts, so the
	// client's transport never sends a request again by itself; and the
	// budget's tokens, floats, only round down.
	bound := int64((1+budget.Ratio)*float64(intents+report.Redrives) + budget.Burst)
	require.LessOrEqual(t, lb.Requests(), bound, "requests within the retry budget")
	require.Equal(t, report.Attempts, lb.Requests(), "the balancer saw every attempt, once")

	require.Positive(t, report.Retries, "the restarts made the intents retry")
	require.Positive(t, report.BudgetRefusals, "the budget refused retries while the server was down")

	requireOnceEach(t, e, report.Results)
}

// requireOnceEach checks that each intent made one order and one charge,
// and nothing else was made: one key record per intent, one order per key
// (its answer's), one charge per order.
func requireOnceEach(t *testing.T, e *env, results []intentResult) {
	t.Helper()
	keys, orders := map[string]bool{}, map[string]bool{}
	for _, res := range results {
		var paid struct {
			OrderID string `json:"order_id"`
			Status  string `json:"status"`
		}
		require.NoError(t, json.Unmarshal(res.Body, &paid), "%s", res.Body)
		require.Equal(t, "paid", paid.Status)
		keys[res.Key], orders[paid.OrderID] = true, true
	}
	require.Len(t, keys, len(results), "a key per intent")
	require.Len(t, orders, len(results), "an order per intent")

	db := dbtest.Connect(t, e.dbURL, 2)
	requireSameSet(t, orders, column(t, db, `SELECT id FROM checkout_orders`), "orders")
	require.Equal(t, len(results), e.count(`SELECT count(*) FROM checkout_orders WHERE status = 'paid'`), "every order paid")

	chargeKeys, chargeIDs := map[string]bool{}, map[string]bool{}
	for _, c := range e.charges() {
		chargeKeys[c.IdempotencyKey], chargeIDs[c.ID] = true, true
	}
	require.Len(t, chargeKeys, len(results), "one charge key per intent at the provider")
	requireSameSet(t, chargeIDs, column(t, db, `SELECT charge_id FROM checkout_orders`), "charges")
	requireSameSet(t, keys, column(t, db, `SELECT key FROM onceflow_keys WHERE tenant_id = 'acme'`), "key records")
}

// requireSameSet fails, saying how many are missing and how many are extra,
// when got is not want.
func requireSameSet(t *testing.T, want, got map[string]bool, what string) {
	t.Helper()
	var missing, extra []string
	for v := range want {
		if !got[v] {
			missing = append(missing, v)
		}
	}
	for v := range got {
		if !want[v] {
			extra = append(extra, v)
		}
	}
	require.True(t, len(missing)+len(extra) == 0, "%s: %d missing %q, %d extra %q, of %d",
		what, len(missing), missing[:min(3, len(missing))], len(extra), extra[:min(3, len(extra))], len(want))
}

// column reads a query's one text column as a set.
func column(t *testing.T, db *pgxpool.Pool, sql string) map[string]bool {
	t.Helper()
	rows, err := db.Query(context.Background(), sql)
	require.NoError(t, err)
	values, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	set := map[string]bool{}
	for _, v := range values {
		require.False(t, set[v], "%q twice", v)
		set[v] = true
	}
	return set
}
