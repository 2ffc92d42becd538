package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/pgtrace"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// benchCase is one part of the suite.
type benchCase struct {
	name string
	run  func(ctx context.Context, srv *server, cfg Config, report *Report) error
}

// The cases that do not run by default.
const (
	explainName = "explain" // with --explain
	scaleName   = "scale"   // when the command line of a worker is known
)

var cases = []benchCase{
	{"checkout", results(checkoutCase)},
	{"realistic", results(realisticCase)},
	{"replay", results(replayCase)},
	{"duplicates", results(duplicatesCase)},
	{"claim latency by table size", results(tableSizeCase)},
	{"pruning", results(pruningCase)},
	{"idemhttp", results(httpCase)},
	{"pacing", results(pacingCase)},
	{scaleName, results(scaleCase)},
	{explainName, explainCase},
}

// results adapts a case that only adds figures to the table.
func results(run func(ctx context.Context, srv *server, cfg Config) ([]Result, error)) func(context.Context, *server, Config, *Report) error {
	return func(ctx context.Context, srv *server, cfg Config, report *Report) error {
		rs, err := run(ctx, srv, cfg)
		report.Results = append(report.Results, rs...)
		return err
	}
}

// Order and Paid are the checkout's request and state.
type Order struct {
	Amount int64 `json:"amount"`
}

type Paid struct {
	OrderID int64 `json:"order_id"`
}

const ordersTable = `CREATE TABLE bench_orders (id bigserial PRIMARY KEY, key text NOT NULL, amount bigint NOT NULL,
	status text NOT NULL)`

// checkoutWorkflow is two atomic phases around a foreign no-op.
func checkoutWorkflow() *workflow.Workflow[Order, Paid] {
	return workflow.Define("checkout",
		phase.Atomic("create_order", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			return tx.QueryRow(ctx, `INSERT INTO bench_orders (key, amount, status) VALUES ($1, $2, 'new') RETURNING id`,
				r.Key.ID, r.Request.Amount).Scan(&r.State.OrderID)
		}),
		foreign.Mutation("charge", func(context.Context, *foreign.Call[Order, Paid]) error { return nil }),
		phase.Atomic("record_charge", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
			_, err := tx.Exec(ctx, `UPDATE bench_orders SET status = 'paid' WHERE id = $1`, r.State.OrderID)
			return err
		}),
	)
}

// checkoutFloor is the same business statements in the same transactions,
// with no onceflow.
func checkoutFloor(db *pgxpool.Pool) op { return checkoutFloorKeyed(db, nil) }

// checkoutFloorKeyed is checkoutFloor, with k's key record written by hand
// in its transactions unless k is nil.
func checkoutFloorKeyed(db *pgxpool.Pool, k *keyRecord) op {
	return func(ctx context.Context, i int64) error {
		var id int64
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `INSERT INTO bench_orders (key, amount, status) VALUES ($1, 100, 'new') RETURNING id`,
				fmt.Sprintf("f%d", i)).Scan(&id); err != nil {
				return err
			}
			return k.insert(ctx, tx, i, []byte(`{"amount":100}`), fmt.Appendf(nil, `{"order_id":%d}`, id))
		})
		if err != nil {
			return err
		}
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE bench_orders SET status = 'paid' WHERE id = $1`, id)
			if err == nil {
				err = k.complete(ctx, tx, i, fmt.Appendf(nil, `{"order_id":%d}`, id))
			}
			return err
		})
	}
}

func checkoutOnceflow(e *workflow.Engine, wf *workflow.Workflow[Order, Paid], prefix string) op {
	return func(ctx context.Context, i int64) error {
		_, err := wf.Run(ctx, e, workflow.Key{Tenant: "bench", ID: fmt.Sprintf("%s%d", prefix, i)}, Order{Amount: 100})
		return err
	}
}

func checkoutCase(ctx context.Context, srv *server, cfg Config) ([]Result, error) {
	db, err := srv.newDatabase(ctx, 32)
	if err != nil {
		return nil, err
	}
	defer db.pool.Close()
	wf := checkoutWorkflow()
	engine, err := workflow.NewEngine(db.pool, workflow.Config{})
	if err != nil {
		return nil, err
	}
	var results []Result
	for _, c := range []int{1, 16} {
		once, floor, gaveUp, err := throughput(ctx, cfg.Rounds, cfg.Round, c, checkoutOnceflow(engine, wf, fmt.Sprintf("c%d-", c)), checkoutFloor(db.pool))
		if err != nil {
			return nil, err
		}
		r := ratio(fmt.Sprintf("micro checkout (2 atomic + 1 foreign), loopback, concurrency %d", c), once, floor, "/s", 0.80)
		r.Note = gaveUpNote(gaveUp)
		bound, err := keyedBound(ctx, cfg, c, "micro checkout", checkoutFloorKeyed(db.pool, &keyRecord{prefix: fmt.Sprintf("k%d-", c)}), checkoutFloor(db.pool))
		if err != nil {
			return nil, err
		}
		results = append(results, r, bound)
	}
	counts, err := countPerOp(ctx, srv, db, 500, "micro checkout", checkoutOnceflow(engine, wf, "count-"), checkoutFloor(db.pool))
	if err != nil {
		return nil, err
	}
	return append(results, counts...), nil
}

// countPerOp runs n operations of each side one after another and counts
// commits (by the server's xact_commit and by the tracer) and round trips.
func countPerOp(ctx context.Context, srv *server, db *database, n int, label string, onceflow, floor op) ([]Result, error) {
	type side struct {
		traced pgtrace.Counts
		xact   float64
	}
	// measure runs fn n times between two readings of xact_commit, each
	// after making every connection publish its statistics.
	measure := func(fn op, n int) (pgtrace.Counts, int64, error) {
		if _, err := flushStats(ctx, db.pool); err != nil {
			return pgtrace.Counts{}, 0, err
		}
		before, err := srv.xactCommits(ctx, db.name)
		if err != nil {
			return pgtrace.Counts{}, 0, err
		}
		tracedBefore := db.counter.Counts()
		var next atomic.Int64
		if _, err := latencies(ctx, n, fn, &next); err != nil {
			return pgtrace.Counts{}, 0, err
		}
		traced := db.counter.Counts().Sub(tracedBefore)
		if _, err := flushStats(ctx, db.pool); err != nil {
			return pgtrace.Counts{}, 0, err
		}
		after, err := srv.xactCommits(ctx, db.name)
		return traced, after - before, err
	}
	// What the readings themselves add: the same measurement of nothing.
	_, overhead, err := measure(func(context.Context, int64) error { return nil }, 1)
	if err != nil {
		return nil, err
	}
	count := func(fn op) (side, error) {
		traced, xact, err := measure(fn, n)
		return side{traced: traced, xact: float64(xact-overhead) / float64(n)}, err
	}
	once, err := count(onceflow)
	if err != nil {
		return nil, err
	}
	floor2, err := count(floor)
	if err != nil {
		return nil, err
	}
	perOp := func(v int64) float64 { return float64(v) / float64(n) }
	onceRT, floorRT := perOp(once.traced.RoundTrips()), perOp(floor2.traced.RoundTrips())
	return []Result{
		{Figure: label + ": commits per workflow (xact_commit)", Onceflow: once.xact, Floor: floor2.xact, Ratio: once.xact,
			// The server's count includes its own background transactions
			// (autovacuum, say), which land on either side: onceflow's may
			// exceed the floor's by the tolerance, and its traced count,
			// the transactions it committed, must be exactly 2.
			Target: "= 2 (atomic phases)", Pass: within(perOp(once.traced.Commits), 2, 0) && once.xact <= floor2.xact+0.02,
			Note: fmt.Sprintf("traced: %.2f vs %.2f", perOp(once.traced.Commits), perOp(floor2.traced.Commits))},
		{Figure: label + ": round trips per workflow", Onceflow: onceRT, Floor: floorRT, Ratio: onceRT - floorRT,
			Target: "≤ floor + 2", Pass: onceRT <= floorRT+2, Note: "ratio column: onceflow − floor"},
	}, nil
}

// Order and Paid checkout through a replayed key, and through the store.
func replayCase(ctx context.Context, srv *server, cfg Config) ([]Result, error) {
	db, err := srv.newDatabase(ctx, 32)
	if err != nil {
		return nil, err
	}
	defer db.pool.Close()
	wf := checkoutWorkflow()
	engine, err := workflow.NewEngine(db.pool, workflow.Config{})
	if err != nil {
		return nil, err
	}
	key := workflow.Key{Tenant: "bench", ID: "done"}
	first, err := wf.Run(ctx, engine, key, Order{Amount: 100})
	if err != nil {
		return nil, err
	}
	store := engine.Store()
	fp := recovery.FingerprintBytes("POST /replay", nil)
	claimKey := recovery.Key{Tenant: "bench", ID: "done-http"}
	rec, _, err := store.Claim(ctx, recovery.ClaimParams{Key: claimKey, Workflow: "POST /replay", Fingerprint: fp})
	if err != nil {
		return nil, err
	}
	if err := store.Complete(ctx, rec.Fence(), first.Response); err != nil {
		return nil, err
	}
	floor := func(k workflow.Key) op {
		return func(ctx context.Context, _ int64) error {
			var status int
			var body []byte
			return db.pool.QueryRow(ctx, `SELECT response_status, response_body FROM onceflow_keys WHERE tenant_id = $1 AND key = $2`,
				k.Tenant, k.ID).Scan(&status, &body)
		}
	}
	viaEngine := func(ctx context.Context, _ int64) error {
		res, err := wf.Run(ctx, engine, key, Order{Amount: 100})
		if err == nil && !res.Replayed {
			err = fmt.Errorf("not a replay")
		}
		return err
	}
	viaStore := func(ctx context.Context, _ int64) error {
		_, outcome, err := store.Claim(ctx, recovery.ClaimParams{Key: claimKey, Workflow: "POST /replay", Fingerprint: fp})
		if err == nil && outcome != recovery.OutcomeReplay {
			err = fmt.Errorf("not a replay")
		}
		return err
	}
	var results []Result
	for _, side := range []struct {
		name string
		fn   op
		k    workflow.Key
	}{{"replay through Workflow.Run", viaEngine, key}, {"replay through Store.Claim (idemhttp)", viaStore, claimKey}} {
		once, fl, _, err := throughput(ctx, cfg.Rounds, cfg.Round, 1, side.fn, floor(side.k))
		if err != nil {
			return nil, err
		}
		before := db.counter.Counts()
		var next atomic.Int64
		if _, err := latencies(ctx, 200, side.fn, &next); err != nil {
			return nil, err
		}
		rts := float64(db.counter.Counts().Sub(before).RoundTrips()) / 200
		r := ratio(side.name+" vs primary-key SELECT", once, fl, "/s", 0.8)
		r.Note = fmt.Sprintf("%.2f round trips per replay", rts)
		results = append(results, r)
	}
	return results, nil
}

// duplicatesCase races 64 runs of one key, many times: one executes. A
// second set of rounds holds the first phase for 2 s: losers must be told
// "in flight" at once, not wait for it.
func duplicatesCase(ctx context.Context, srv *server, cfg Config) ([]Result, error) {
	const racers, rounds, slowRounds, slowPhase = 64, 20, 3, 2 * time.Second
	db, err := srv.newDatabase(ctx, racers+4)
	if err != nil {
		return nil, err
	}
	defer db.pool.Close()
	var executions atomic.Int64
	define := func(name string, hold time.Duration) *workflow.Workflow[Order, Paid] {
		return workflow.Define(name,
			phase.Atomic("once", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Order, Paid]) error {
				executions.Add(1)
				time.Sleep(hold)
				return nil
			}),
		)
	}
	engine, err := workflow.NewEngine(db.pool, workflow.Config{})
	if err != nil {
		return nil, err
	}
	race := func(wf *workflow.Workflow[Order, Paid], rounds int) (losers []time.Duration, most int64) {
		var mu sync.Mutex
		for round := range rounds {
			executions.Store(0)
			var wg sync.WaitGroup
			start := make(chan struct{})
			key := workflow.Key{Tenant: "bench", ID: fmt.Sprintf("%s-%d", wf.Name(), round)}
			for range racers {
				wg.Go(func() {
					<-start
					began := time.Now()
					res, err := wf.Run(ctx, engine, key, Order{Amount: 1})
					took := time.Since(began)
					if err != nil || res.Replayed {
						mu.Lock()
						losers = append(losers, took)
						mu.Unlock()
					}
				})
			}
			close(start)
			wg.Wait()
			most = max(most, executions.Load())
		}
		return losers, most
	}
	// A first race, not counted, opens the pool's connections: what the
	// figure measures is a duplicate's answer, not a new backend's start.
	warm := define("dup_warm", 0)
	if _, warmMost := race(warm, 1); warmMost != 1 {
		return nil, fmt.Errorf("64 concurrent duplicates: %d executions of one key while warming up", warmMost)
	}
	losers, most := race(define("dup", 0), rounds)
	slowLosers, slowMost := race(define("dup_slow", slowPhase), slowRounds)
	most = max(most, slowMost)
	p99, slowP99 := ms(percentile(losers, 99)), ms(percentile(slowLosers, 99))
	return []Result{
		{Figure: "64 concurrent duplicates: executions per key", Onceflow: float64(most), Ratio: float64(most),
			Target: "= 1", Pass: most == 1, Note: fmt.Sprintf("%d + %d rounds", rounds, slowRounds)},
		{Figure: "64 concurrent duplicates: losers' p99", Onceflow: p99, Unit: "ms", Ratio: p99, Target: "≤ 100 ms", Pass: p99 <= 100,
			Note: "a loser gets 409 (in flight) or, once the winner committed, the replay"},
		{Figure: "64 duplicates, first phase 2 s: losers' p99", Onceflow: slowP99, Unit: "ms", Ratio: slowP99,
			Target: "≤ 100 ms", Pass: slowP99 <= 100, Note: "a loser must not wait for the winner's first phase"},
	}, nil
}

// keyedBound measures the floor with a key record written by hand (one
// insert and one update of the least record, keyed, in the floor's own
// transactions) against the floor, at concurrency c: what storing any
// durable key record costs on this server, so the ceiling of the ratio
// any idempotency layer keeping one can reach. It has no target.
func keyedBound(ctx context.Context, cfg Config, c int, workload string, keyed, floor op) (Result, error) {
	k, f, gaveUp, err := throughput(ctx, cfg.Rounds, cfg.Round, c, keyed, floor)
	if err != nil {
		return Result{}, err
	}
	r := ratio(fmt.Sprintf("%s: floor + a key record by hand (the bound), concurrency %d", workload, c), k, f, "/s", 0)
	r.Target, r.Pass, r.Note = "reported", true, gaveUpNote(gaveUp)
	return r, nil
}

func ratio(figure string, once, floor float64, unit string, target float64) Result {
	r := once / floor
	return Result{Figure: figure, Onceflow: once, Floor: floor, Unit: unit, Ratio: r,
		Target: fmt.Sprintf("≥ %.2f × floor", target), Pass: r >= target}
}

func within(v, want, tolerance float64) bool { return v >= want-tolerance && v <= want+tolerance }

// execer is what a handler writes with: a pool or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}
