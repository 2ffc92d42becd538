package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/workflow"
)

// ExplainWorkflowsDefault is how many workflows each side of a breakdown
// runs, one after another, after a third as many to warm up.
const ExplainWorkflowsDefault = 300

// The sides of a breakdown.
const (
	sideOnceflow  = "onceflow"
	sideFloor     = "floor"
	sideKeyRecord = "floor + key record"
	// sideWholeRecord writes onceflow's own record by hand, once inserted
	// and once updated.
	sideWholeRecord = "floor + whole record"
)

// Breakdown is what one workflow costs on each side, measured one workflow
// at a time on a quiet database: the explain case's table.
type Breakdown struct {
	Workload  string `json:"workload"`
	Workflows int    `json:"workflows"`
	// Sides are onceflow, the floor, and the floor with a key record
	// written by hand (one insert, one update): the WAL bound.
	Sides []Cost `json:"sides"`
	// Top is each side's costliest statements, by server time.
	Top map[string][]StatementCost `json:"top"`
}

// Cost is one side's cost per workflow.
type Cost struct {
	Side         string  `json:"side"`
	RoundTrips   float64 `json:"round_trips"`
	Commits      float64 `json:"commits"`
	WALBytes     float64 `json:"wal_bytes"`
	ServerTimeUS float64 `json:"server_time_us"` // pg_stat_statements exec + plan
	ServerCPUUS  float64 `json:"server_cpu_us"`  // the server's processes, /proc; -1 unknown
	RowsInserted float64 `json:"rows_inserted"`
	RowsUpdated  float64 `json:"rows_updated"`
	HOTUpdates   float64 `json:"hot_updates"`
	ClientCPUUS  float64 `json:"client_cpu_us"`
}

// StatementCost is one statement's share of a side's server time.
type StatementCost struct {
	Query            string  `json:"query"`
	CallsPerWorkflow float64 `json:"calls_per_workflow"`
	MeanUS           float64 `json:"mean_us"`
	Share            float64 `json:"share"` // of the side's server time
}

// side returns the cost of the side named name.
func (b *Breakdown) side(name string) Cost {
	for _, c := range b.Sides {
		if c.Side == name {
			return c
		}
	}
	return Cost{}
}

// workload is one checkout, as the three sides of a breakdown run it.
type workload struct {
	name   string
	schema string // business tables beyond bench_orders
	// sides returns each side's operation for a prefix of its keys.
	sides func(e *workflow.Engine, db *database) map[string]func(prefix string) op
}

var workloads = []workload{
	{"micro checkout", "", func(e *workflow.Engine, db *database) map[string]func(string) op {
		wf := checkoutWorkflow()
		return map[string]func(string) op{
			sideOnceflow:    func(p string) op { return checkoutOnceflow(e, wf, p) },
			sideFloor:       func(string) op { return checkoutFloor(db.pool) },
			sideKeyRecord:   func(p string) op { return checkoutFloorKeyed(db.pool, &keyRecord{prefix: p}) },
			sideWholeRecord: func(p string) op { return checkoutFloorKeyed(db.pool, &keyRecord{prefix: "w" + p, whole: true}) },
		}
	}},
	{"realistic checkout", shopSchema, func(e *workflow.Engine, db *database) map[string]func(string) op {
		wf := realisticWorkflow()
		return map[string]func(string) op{
			sideOnceflow:    func(p string) op { return realisticOnceflow(e, wf, p) },
			sideFloor:       func(p string) op { return realisticFloor(db.pool, p+"f", nil) },
			sideKeyRecord:   func(p string) op { return realisticFloor(db.pool, p+"k", &keyRecord{prefix: p}) },
			sideWholeRecord: func(p string) op { return realisticFloor(db.pool, p+"w", &keyRecord{prefix: "w" + p, whole: true}) },
		}
	}},
}

// explainCase measures the breakdown of each workload, and the WAL
// onceflow adds to the floor's against its bound.
func explainCase(ctx context.Context, srv *server, cfg Config, report *Report) error {
	for _, w := range workloads {
		b, err := explain(ctx, srv, w, cfg.ExplainWorkflows)
		if err != nil {
			return fmt.Errorf("%s: %w", w.name, err)
		}
		report.Explain = append(report.Explain, *b)
		report.Results = append(report.Results, b.walResults()...)
	}
	return nil
}

// walResults are the figures of the WAL onceflow adds to the floor's:
// against onceflow's own record written by hand, one insert and one update
// (the target: onceflow writes its record no more often, and no larger,
// than that), and, reported, against the least key record (what the
// record's history, definition, principal and state cost).
func (b *Breakdown) walResults() []Result {
	floor := b.side(sideFloor).WALBytes
	beyond := b.side(sideOnceflow).WALBytes - floor
	whole, least := b.side(sideWholeRecord).WALBytes-floor, b.side(sideKeyRecord).WALBytes-floor
	return []Result{
		{Figure: b.Workload + ": WAL bytes per workflow beyond the floor's", Onceflow: beyond, Floor: whole, Unit: "B",
			Ratio: beyond / whole, Target: "≤ 1 key-record insert + 1 update", Pass: beyond <= whole*walTolerance,
			Note: "floor column: onceflow's record inserted once and updated once by hand, beside the floor"},
		{Figure: b.Workload + ": WAL bytes per workflow beyond the floor's, vs the least key record", Onceflow: beyond, Floor: least,
			Unit: "B", Ratio: beyond / least, Target: "reported", Pass: true,
			Note: "floor column: a record of the request, its hash, an owner and the response, inserted and updated by hand"},
	}
}

// walTolerance is how far over its bound the WAL figure may be and pass:
// the WAL of one workflow varies by a few bytes (a page's first record,
// the alignment of a longer key).
const walTolerance = 1.05

// explain runs each side of w on a database of its own, one workflow at a
// time, after a checkpoint and a warm-up, so that each side's WAL holds no
// full-page image the other's does not.
func explain(ctx context.Context, srv *server, w workload, n int) (*Breakdown, error) {
	db, err := srv.newDatabase(ctx, 2)
	if err != nil {
		return nil, err
	}
	defer db.close()
	if w.schema != "" {
		if _, err := db.pool.Exec(ctx, w.schema); err != nil {
			return nil, err
		}
	}
	admin, err := pgx.Connect(ctx, srv.url)
	if err != nil {
		return nil, err
	}
	defer admin.Close(ctx)
	if err := quiet(ctx, admin, db); err != nil {
		return nil, err
	}
	engine, err := workflow.NewEngine(db.pool, workflow.Config{})
	if err != nil {
		return nil, err
	}
	order := []string{sideOnceflow, sideFloor, sideKeyRecord, sideWholeRecord}
	sides := w.sides(engine, db)
	for _, name := range order {
		var next atomic.Int64
		if _, err := latencies(ctx, n/3, sides[name]("warm-"), &next); err != nil {
			return nil, err
		}
	}
	b := &Breakdown{Workload: w.name, Workflows: n, Top: map[string][]StatementCost{}}
	for _, name := range order {
		cost, top, err := measureCost(ctx, srv, admin, db, n, sides[name]("x-"))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		cost.Side = name
		b.Sides = append(b.Sides, cost)
		b.Top[name] = top
	}
	return b, nil
}

// quiet prepares the measurement: pg_stat_statements, no autovacuum on the
// database's tables (its WAL would be counted), and a checkpoint, after
// which the warm-up writes the full-page images of the pages both sides
// touch.
func quiet(ctx context.Context, admin *pgx.Conn, db *database) error {
	if _, err := admin.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return fmt.Errorf("pg_stat_statements (--explain loads it in the throwaway server; "+
			"on another add it to shared_preload_libraries): %w", err)
	}
	_, err := db.pool.Exec(ctx, `DO $$ DECLARE t regclass; BEGIN
		FOR t IN SELECT oid FROM pg_class WHERE relkind = 'r' AND relnamespace = current_schema()::regnamespace LOOP
			EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = false)', t);
		END LOOP; END $$`)
	if err == nil {
		_, err = admin.Exec(ctx, `CHECKPOINT`)
	}
	return err
}

// counters are the server's figures measureCost reads before and after.
type counters struct {
	xact, inserted, updated, hot int64
}

func readCounters(ctx context.Context, admin *pgx.Conn, db *database) (counters, error) {
	if _, err := flushStats(ctx, db.pool); err != nil {
		return counters{}, err
	}
	var c counters
	err := admin.QueryRow(ctx, `SELECT xact_commit, tup_inserted, tup_updated FROM pg_stat_database WHERE datname = $1`,
		db.name).Scan(&c.xact, &c.inserted, &c.updated)
	if err == nil {
		err = db.pool.QueryRow(ctx, `SELECT coalesce(sum(n_tup_hot_upd), 0)::bigint FROM pg_stat_user_tables`).Scan(&c.hot)
	}
	return c, err
}

// measureCost runs fn n times and returns its cost per workflow and its
// top statements.
func measureCost(ctx context.Context, srv *server, admin *pgx.Conn, db *database, n int, fn op) (Cost, []StatementCost, error) {
	// What the readings add to xact_commit: the same readings around nothing.
	before, err := readCounters(ctx, admin, db)
	if err != nil {
		return Cost{}, nil, err
	}
	again, err := readCounters(ctx, admin, db)
	if err != nil {
		return Cost{}, nil, err
	}
	overhead := again.xact - before.xact
	if _, err := admin.Exec(ctx, `SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = $1), 0)`,
		db.name); err != nil {
		return Cost{}, nil, err
	}
	var lsn string
	if err := admin.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		return Cost{}, nil, err
	}
	serverBefore, serverErr := srv.serverCPU()
	clientBefore, traced := clientCPU(), db.counter.Counts()
	var next atomic.Int64
	if _, err := latencies(ctx, n, fn, &next); err != nil {
		return Cost{}, nil, err
	}
	client, rt := clientCPU()-clientBefore, db.counter.Counts().Sub(traced).RoundTrips()
	serverAfter, _ := srv.serverCPU()
	var wal int64
	if err := admin.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, lsn).Scan(&wal); err != nil {
		return Cost{}, nil, err
	}
	serverTime, top, err := topStatements(ctx, admin, db.name, n)
	if err != nil {
		return Cost{}, nil, err
	}
	after, err := readCounters(ctx, admin, db)
	if err != nil {
		return Cost{}, nil, err
	}
	per := func(v float64) float64 { return v / float64(n) }
	us := func(d time.Duration) float64 { return per(float64(d) / float64(time.Microsecond)) }
	cost := Cost{
		RoundTrips: per(float64(rt)), Commits: per(float64(after.xact - again.xact - overhead)), WALBytes: per(float64(wal)),
		ServerTimeUS: us(serverTime), ServerCPUUS: us(serverAfter - serverBefore),
		RowsInserted: per(float64(after.inserted - again.inserted)), RowsUpdated: per(float64(after.updated - again.updated)),
		HOTUpdates: per(float64(after.hot - again.hot)), ClientCPUUS: us(client),
	}
	if errors.Is(serverErr, errNoServerCPU) {
		cost.ServerCPUUS = -1
	}
	return cost, top, nil
}

// topStatements returns the server time of database name's statements
// since the last reset, and the costliest five.
func topStatements(ctx context.Context, admin *pgx.Conn, name string, n int) (time.Duration, []StatementCost, error) {
	rows, err := admin.Query(ctx, `SELECT query, calls, total_exec_time + total_plan_time FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1) ORDER BY 3 DESC`, name)
	if err != nil {
		return 0, nil, err
	}
	type stmt struct {
		query string
		calls int64
		ms    float64
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stmt, error) {
		var s stmt
		return s, r.Scan(&s.query, &s.calls, &s.ms)
	})
	if err != nil {
		return 0, nil, err
	}
	var total float64
	for _, s := range all {
		total += s.ms
	}
	var top []StatementCost
	for _, s := range all[:min(len(all), 5)] {
		top = append(top, StatementCost{Query: oneLine(s.query, 90), CallsPerWorkflow: float64(s.calls) / float64(n),
			MeanUS: s.ms * 1000 / float64(max(s.calls, 1)), Share: s.ms / total})
	}
	return time.Duration(total * float64(time.Millisecond)), top, nil
}

// oneLine collapses q's white space and cuts it to n characters.
func oneLine(q string, n int) string {
	q = strings.Join(strings.Fields(q), " ")
	if r := []rune(q); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return q
}

// WriteTable prints the breakdown: a row per figure, a column per side,
// then each side's costliest statements.
func (b *Breakdown) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "explain: %s, per workflow (%d per side, one at a time, loopback, after a checkpoint and a warm-up)\n",
		b.Workload, b.Workflows)
	t := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(t, "\t%s\t%s\tDIFFERENCE\t%s\t%s\t\n", strings.ToUpper(sideOnceflow), strings.ToUpper(sideFloor),
		strings.ToUpper(sideKeyRecord), strings.ToUpper(sideWholeRecord))
	once, floor, keyed, whole := b.side(sideOnceflow), b.side(sideFloor), b.side(sideKeyRecord), b.side(sideWholeRecord)
	for _, row := range []struct {
		name string
		get  func(Cost) float64
	}{
		{"round trips (pgx)", func(c Cost) float64 { return c.RoundTrips }},
		{"commits (xact_commit)", func(c Cost) float64 { return c.Commits }},
		{"WAL bytes", func(c Cost) float64 { return c.WALBytes }},
		{"server time µs (pg_stat_statements exec+plan)", func(c Cost) float64 { return c.ServerTimeUS }},
		{"server CPU µs (its processes, /proc)", func(c Cost) float64 { return c.ServerCPUUS }},
		{"rows inserted", func(c Cost) float64 { return c.RowsInserted }},
		{"rows updated", func(c Cost) float64 { return c.RowsUpdated }},
		{"  of which HOT", func(c Cost) float64 { return c.HOTUpdates }},
		{"client CPU µs (getrusage)", func(c Cost) float64 { return c.ClientCPUUS }},
	} {
		o, f, k, h := row.get(once), row.get(floor), row.get(keyed), row.get(whole)
		if o < 0 || f < 0 {
			fmt.Fprintf(t, "%s\tn/a\tn/a\t\tn/a\tn/a\t\n", row.name)
			continue
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%+.2f\t%s\t%s\t\n", row.name, number(o), number(f), o-f, number(k), number(h))
	}
	if err := t.Flush(); err != nil {
		return err
	}
	rs := b.walResults()
	fmt.Fprintf(w, "WAL beyond the floor: %s B per workflow; onceflow's record inserted and updated once by hand: %s B (%.2f×); the least key record: %s B (%.2f×)\n",
		number(rs[0].Onceflow), number(rs[0].Floor), rs[0].Ratio, number(rs[1].Floor), rs[1].Ratio)
	for _, side := range []string{sideOnceflow, sideFloor} {
		fmt.Fprintf(w, "\ncostliest statements, %s (server time):\n", side)
		t := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(t, "SHARE\tCALLS/WF\tMEAN µs\tSTATEMENT")
		for _, s := range b.Top[side] {
			fmt.Fprintf(t, "%.0f%%\t%.2f\t%.1f\t%s\n", 100*s.Share, s.CallsPerWorkflow, s.MeanUS, s.Query)
		}
		if err := t.Flush(); err != nil {
			return err
		}
	}
	return nil
}
