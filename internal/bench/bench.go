// Package bench measures what onceflow costs against the bare-SQL floor: the
// same business statements in the same transactions with no onceflow,
// measured in the same run against the same PostgreSQL, in alternation so
// that a noisy machine affects both alike. Every figure is a ratio against
// its floor, or a count.
//
// `onceflow bench` runs the suite and prints the table; the Benchmark
// functions in this package run single cases under `go test -bench`.
package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Config configures a run.
type Config struct {
	// DatabaseURL is a server where the user may CREATE DATABASE; "" starts
	// a throwaway cluster.
	DatabaseURL string
	// Round is how long each side of each throughput round runs. 0 means 1s.
	Round time.Duration
	// Rounds is how many times the two sides alternate. 0 means 5.
	Rounds int
	// LargeTable is the row count of the large claim-latency table. 0 means
	// one million.
	LargeTable int
	// Cases, if not empty, runs only the cases of these names (see
	// CaseNames). Empty runs every case but the opt-in ones (explain).
	Cases []string
	// NoFsync runs the throwaway server with fsync and full_page_writes
	// off: faster, not what production runs. false (the default) is
	// durable. It does not apply to DatabaseURL.
	NoFsync bool
	// NetworkDelay is the one-way delay of the network between the
	// application and the database in the realistic and scale cases: a
	// proxy adds it to every message in each direction. 0 connects
	// directly, over loopback. The command's default is
	// NetworkDelayDefault.
	NetworkDelay time.Duration
	// Explain adds the explain case: a per-workflow breakdown of what
	// onceflow and the floor cost the database and the client.
	Explain bool
	// ExplainWorkflows is how many workflows each side of the breakdown
	// runs. 0 means ExplainWorkflowsDefault.
	ExplainWorkflows int
	// Worker is the command line that runs one scale worker process (see
	// RunWorker): the onceflow binary and its hidden subcommand. nil leaves
	// the scale case out.
	Worker []string
	// Logger receives progress. nil discards it.
	Logger *slog.Logger
}

// NetworkDelayDefault is the one-way delay of a network in one zone, which
// the command's --network-delay defaults to.
const NetworkDelayDefault = 250 * time.Microsecond

// CaseNames lists the cases of the suite, in the order they run.
func CaseNames() []string {
	names := make([]string, len(cases))
	for i, c := range cases {
		names[i] = c.name
	}
	return names
}

// Result is one figure of the table.
type Result struct {
	Figure   string  `json:"figure"`
	Onceflow float64 `json:"onceflow"`
	Floor    float64 `json:"floor"`
	Unit     string  `json:"unit"`
	// Ratio is Onceflow/Floor for throughputs; for other figures it is the
	// figure the target is about (see Target).
	Ratio  float64 `json:"ratio"`
	Target string  `json:"target"`
	Pass   bool    `json:"pass"`
	Note   string  `json:"note,omitempty"`
}

// Report is a run's results and where they were measured.
type Report struct {
	Results []Result `json:"results"`
	// Explain is the explain case's breakdown, one per workload.
	Explain  []Breakdown `json:"explain,omitempty"`
	Network  string      `json:"network"`
	Machine  string      `json:"machine"`
	Postgres string      `json:"postgres"`
	Started  time.Time   `json:"started"`
	Took     string      `json:"took"`
}

// Run runs every case.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.Round = cmp.Or(cfg.Round, time.Second)
	cfg.Rounds = cmp.Or(cfg.Rounds, 5)
	cfg.LargeTable = cmp.Or(cfg.LargeTable, 1_000_000)
	cfg.ExplainWorkflows = cmp.Or(cfg.ExplainWorkflows, ExplainWorkflowsDefault)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	started := time.Now()
	srv, err := startServer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer srv.close()
	report := &Report{
		Machine: fmt.Sprintf("%s/%s, %d CPUs, %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version()),
		Started: started,
	}
	report.Postgres, err = srv.version(ctx)
	if err != nil {
		return nil, err
	}
	for _, name := range cfg.Cases {
		if !slices.Contains(CaseNames(), name) {
			return nil, fmt.Errorf("no case %q; the cases are %s", name, strings.Join(CaseNames(), ", "))
		}
	}
	report.Network = network(cfg.NetworkDelay)
	for _, c := range cases {
		if !cfg.runs(c) {
			continue
		}
		cfg.Logger.Info("running", slog.String("case", c.name))
		if err := c.run(ctx, srv, cfg, report); err != nil {
			return nil, fmt.Errorf("case %s: %w", c.name, err)
		}
	}
	report.Took = time.Since(started).Round(time.Second).String()
	return report, nil
}

// runs reports whether the run includes case c.
func (cfg Config) runs(c benchCase) bool {
	switch {
	case len(cfg.Cases) > 0:
		return slices.Contains(cfg.Cases, c.name) || (c.name == explainName && cfg.Explain)
	case c.name == explainName:
		return cfg.Explain
	case c.name == scaleName:
		return cfg.Worker != nil
	}
	return true
}

func network(delay time.Duration) string {
	if delay <= 0 {
		return "realistic and scale cases over loopback, directly"
	}
	return fmt.Sprintf("realistic and scale cases through a proxy adding %s each way; other cases over loopback, directly", delay)
}

// Passed reports whether every figure met its target.
func (r *Report) Passed() bool {
	for _, res := range r.Results {
		if !res.Pass {
			return false
		}
	}
	return true
}

// WriteTable prints the report as an aligned table.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "onceflow bench: %s; took %s\n%s\nnetwork: %s\n\n", r.Machine, r.Took, r.Postgres, r.Network)
	t := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(t, "FIGURE\tONCEFLOW\tFLOOR\tRATIO\tTARGET\tRESULT\tNOTE")
	for _, res := range r.Results {
		verdict := "pass"
		if !res.Pass {
			verdict = "FAIL"
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", res.Figure, value(res.Onceflow, res.Unit), value(res.Floor, res.Unit),
			number(res.Ratio), res.Target, verdict, res.Note)
	}
	if err := t.Flush(); err != nil {
		return err
	}
	for _, b := range r.Explain {
		fmt.Fprintln(w)
		if err := b.WriteTable(w); err != nil {
			return err
		}
	}
	return nil
}

// WriteJSON prints the report as JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func value(v float64, unit string) string {
	if unit == "" {
		return number(v)
	}
	return strings.TrimSpace(number(v) + " " + unit)
}

func number(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
