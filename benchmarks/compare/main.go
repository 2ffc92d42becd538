// Command compare runs one checkout (insert an order, a no-op foreign call,
// mark the order paid: two tiny transactions) on the bare statements, on
// onceflow, on DBOS Transact and on River, alternated on one durable
// PostgreSQL, and prints workflows per second, the ratio to the bare
// statements and the commits per workflow.
//
//	cd benchmarks/compare && go run .
//
// It is a module of its own so that onceflow never depends on DBOS or
// River; docs/benchmarks.md says what each side does.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// config is the command line.
type config struct {
	rounds      int
	duration    time.Duration
	warmup      time.Duration
	concurrency []int
	databaseURL string
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	var cfg config
	var conc string
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds; each runs every side at every concurrency, in turn")
	fs.DurationVar(&cfg.duration, "duration", 3*time.Second, "how long each side runs in each round at each concurrency")
	fs.DurationVar(&cfg.warmup, "warmup", time.Second, "how long each side runs once before the rounds, not counted")
	fs.StringVar(&conc, "concurrency", "1,16", "comma-separated numbers of workflows run at once")
	fs.StringVar(&cfg.databaseURL, "database-url", "",
		"PostgreSQL to run on (its settings are left as they are); empty starts a throwaway server with fsync on")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	for f := range strings.SplitSeq(conc, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 || c > maxConcurrency {
			return cfg, fmt.Errorf("--concurrency: %q is not a number from 1 to %d", f, maxConcurrency)
		}
		cfg.concurrency = append(cfg.concurrency, c)
	}
	if cfg.rounds < 1 || cfg.duration <= 0 {
		return cfg, fmt.Errorf("--rounds must be at least 1 and --duration positive")
	}
	return cfg, nil
}

// maxConcurrency bounds --concurrency: each side's pool has that many
// connections and a few more, on one server.
const maxConcurrency = 64

// run sets every side up on one server, runs the rounds and prints the
// table.
func run(ctx context.Context, cfg config, out io.Writer) error {
	srv, err := startServer(ctx, cfg.databaseURL)
	if err != nil {
		return err
	}
	defer srv.close()
	desc, err := srv.describe(ctx)
	if err != nil {
		return err
	}
	built, err := buildSides(ctx, srv, slices.Max(cfg.concurrency))
	if err != nil {
		return err
	}
	defer closeSides(built)
	tallies, err := rounds(ctx, srv, cfg, built)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s; %s/%s, %d CPUs, %s; %d rounds of %s per side and concurrency\n\n",
		desc, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), cfg.rounds, cfg.duration)
	printTable(out, cfg.concurrency, built, tallies)
	return nil
}

// pool size beyond the concurrency: the background work of DBOS and River.
const spareConns = 8

func buildSides(ctx context.Context, srv *server, workers int) ([]*side, error) {
	var built []*side
	for _, def := range sides {
		db, err := srv.newDatabase(ctx, def.name, int32(workers+spareConns))
		if err == nil {
			var s *side
			if s, err = def.new(ctx, db, workers); err == nil {
				s.name = def.name
				built = append(built, s)
				continue
			}
			db.pool.Close()
		}
		closeSides(built)
		return nil, fmt.Errorf("set up %s: %w", def.name, err)
	}
	return built, nil
}

func closeSides(built []*side) {
	for _, s := range built {
		s.close()
		s.db.pool.Close()
	}
}

// rounds warms every side up, then runs, round after round, each
// concurrency on every side in turn, starting each round with the next
// side so that none always runs after the same one.
func rounds(ctx context.Context, srv *server, cfg config, built []*side) (map[string]map[int]*tally, error) {
	ks := make(map[string]*keys, len(built))
	tallies := make(map[string]map[int]*tally, len(built))
	for _, s := range built {
		ks[s.name] = &keys{prefix: s.name}
		tallies[s.name] = make(map[int]*tally)
		for _, c := range cfg.concurrency {
			tallies[s.name][c] = &tally{}
		}
		if _, _, err := runFor(ctx, cfg.warmup, slices.Max(cfg.concurrency), s, ks[s.name]); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	for round := range cfg.rounds {
		for _, c := range cfg.concurrency {
			for i := range built {
				s := built[(i+round)%len(built)]
				n, took, commits, err := measure(ctx, srv, s, ks[s.name], c, cfg.duration)
				if err != nil {
					return nil, err
				}
				t := tallies[s.name][c]
				t.workflows += n
				t.took += took
				t.commits += commits
				t.perRound = append(t.perRound, float64(n)/took.Seconds())
			}
		}
	}
	return tallies, nil
}

// printTable prints one Markdown row per side: per concurrency, workflows
// per second, the ratio to the floor over all rounds with the range of the
// rounds' ratios, and commits per workflow.
func printTable(out io.Writer, concurrency []int, built []*side, tallies map[string]map[int]*tally) {
	header, rule := "| side |", "|---|"
	for _, c := range concurrency {
		header += fmt.Sprintf(" c=%d wf/s | × floor (rounds) | commits/wf |", c)
		rule += "---:|---:|---:|"
	}
	fmt.Fprintln(out, header)
	fmt.Fprintln(out, rule)
	floor := tallies[built[0].name]
	for _, s := range built {
		row := "| " + s.name + " |"
		for _, c := range concurrency {
			t, f := tallies[s.name][c], floor[c]
			lo, hi := roundRatios(t.perRound, f.perRound)
			row += fmt.Sprintf(" %.0f | %.2f (%.2f–%.2f) | %.2f |", t.rate(), t.rate()/f.rate(), lo, hi, t.commitsPerWorkflow())
		}
		fmt.Fprintln(out, row)
	}
}

// roundRatios returns the least and greatest ratio of a side's rate to the
// floor's in the same round.
func roundRatios(side, floor []float64) (lo, hi float64) {
	for i := range side {
		r := side[i] / floor[i]
		if i == 0 || r < lo {
			lo = r
		}
		if i == 0 || r > hi {
			hi = r
		}
	}
	return lo, hi
}
