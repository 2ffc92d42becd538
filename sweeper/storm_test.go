package sweeper_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/testapp"
	"github.com/onceflow/onceflow/sweeper"
	"github.com/onceflow/onceflow/workflow"
)

// The recovery storm: the provider allows 50 calls a second and 5 at once.
// The pacer is set so that the provider's limit holds whatever the callers'
// delays: a window of a second sees at most Burst + Rate·1s + Concurrency
// calls start (see foreign.Pace).
const (
	stormBig, stormSmall  = 990, 10 // abandoned checkouts of tenants "big" and "small"
	stormProviderRate     = 50      // calls a second the provider allows
	stormProviderParallel = 5       // calls at once the provider allows
	stormBurst            = 1
	stormRate             = stormProviderRate - stormBurst - stormProviderParallel
	stormCompleters       = 3
	stormRounds           = 120 // a bound on completer runs, far above the ~10 needed
	stormSlowRounds       = 4   // rounds of slow calls (a round resumes about 100)
)

// TestRecoveryStorm: 1,000 checkouts abandoned before their charge (990 of
// one tenant, then 10 of another) are finished by three completers, each
// with an engine and a pool of its own, as three sweeper processes, every
// charge paced as "payments". The provider never sees more than its limits
// (it counts calls at once, and calls in every window of a second), every
// checkout is charged exactly once and completed, and the small tenant's
// ten are all completed by the completers' first runs, although 990
// records of the other tenant became due before them. (Mutations caught:
// the completer's turns across tenants dropped, so the small tenant waits
// behind the big one; the pacer's slot skipped, so the provider sees more
// than 5 at once; the bucket taking no token, so it sees more than 50 in a
// second.)
func TestRecoveryStorm(t *testing.T) {
	b := setup(t)
	pacing := map[string]foreign.Pace{"payments": {Concurrency: stormProviderParallel, Rate: stormRate, Burst: stormBurst}}
	storm := testapp.Checkout(b.provider.URL, testapp.Options{Charge: []foreign.Option{foreign.Limit("payments")}})
	b.abandonBeforeCharge(t, storm, "big", stormBig)
	b.abandonBeforeCharge(t, storm, "small", stormSmall)
	// Slow calls first, which the concurrency limit holds back (44 a
	// second of them would be 6.6 at once), then quick ones, which the rate
	// holds back (5 at once of them would be 500 a second).
	b.provider.SetLatency(150 * time.Millisecond)

	completers := make([]*sweeper.Completer, stormCompleters)
	for i := range completers {
		pool := dbtest.Connect(t, b.url, 8)
		e, err := workflow.NewEngine(pool, workflow.Config{Pacing: pacing, Workflows: []workflow.Definition{storm}})
		require.NoError(t, err)
		completers[i], err = sweeper.NewCompleter(pool, e, sweeper.CompleterConfig{BackoffBase: -1})
		require.NoError(t, err)
	}
	inFlight := func(tenant string) int {
		return b.count(t, `SELECT count(*) FROM onceflow_keys WHERE status <> 'completed' AND tenant_id LIKE $1`, tenant)
	}

	started := time.Now()
	runAll(t, b.ctx, completers)
	require.Zero(t, inFlight("small"), "the small tenant's records are done in the first runs")
	rounds := 1
	for ; inFlight("%") > 0 && rounds < stormRounds; rounds++ {
		if rounds == stormSlowRounds {
			b.provider.SetLatency(10 * time.Millisecond)
		}
		runAll(t, b.ctx, completers)
	}
	took := time.Since(started)

	require.Zero(t, inFlight("%"), "every checkout completed within %d rounds", stormRounds)
	require.Equal(t, stormBig+stormSmall, b.provider.Effects("charges"))
	require.Equal(t, 1, b.provider.MaxCalls("charges"), "one charge call per key")
	require.Equal(t, stormBig+stormSmall, b.count(t, `SELECT count(*) FROM ledger`), "one ledger entry per order")
	most, perSecond := b.provider.MaxConcurrent(), b.provider.MaxIn(time.Second)
	require.LessOrEqual(t, most, stormProviderParallel)
	require.LessOrEqual(t, perSecond, stormProviderRate)
	t.Logf("%d checkouts in %s over %d rounds; provider: at most %d at once, %d in a second (limits %d, %d)",
		stormBig+stormSmall, took.Round(time.Millisecond), rounds, most, perSecond, stormProviderParallel, stormProviderRate)
}

// runAll runs every completer once, at once.
func runAll(t *testing.T, ctx context.Context, completers []*sweeper.Completer) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(completers))
	for i, c := range completers {
		wg.Go(func() { errs[i] = c.Run(ctx) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// abandonBeforeCharge runs n checkouts of w for tenant whose process dies
// before the charge (after create_order committed), eight at a time, and
// ends their leases.
func (b *bundle) abandonBeforeCharge(t *testing.T, w *workflow.Workflow[Order, State], tenant string, n int) {
	t.Helper()
	e, err := workflow.NewEngine(b.db, workflow.Config{Hooks: &workflow.Hooks{
		CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
			if p == (workflow.CrashPoint{Kind: workflow.BeforeStep, Step: "charge"}) {
				return fmt.Errorf("died")
			}
			return nil
		},
	}})
	require.NoError(t, err)
	var (
		wg   sync.WaitGroup
		next = make(chan int)
		errs = make(chan error, n)
	)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				_, err := w.Run(b.ctx, e, workflow.Key{Tenant: tenant, ID: fmt.Sprintf("abandoned-%04d", i)}, Order{Amount: int64(100 + i)})
				errs <- err
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.ErrorIs(t, err, workflow.ErrCrashed)
	}
	_, err = b.db.Exec(b.ctx, `UPDATE onceflow_keys SET locked_until = clock_timestamp() - interval '1 second'
		WHERE tenant_id = $1`, tenant)
	require.NoError(t, err)
}
