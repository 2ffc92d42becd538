package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/internal/bench"
)

func newBench(opts *options) *cobra.Command {
	var (
		cfg    bench.Config
		asJSON bool
		check  bool
		fsync  string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure onceflow against the bare-SQL floor and print the table",
		Long: `bench runs each case against onceflow and against its floor, the same business
statements in the same transactions without onceflow, in alternation on the same
PostgreSQL, and prints each figure as a ratio against its floor, or a count, with its
target; the table's header says the server's durability settings.

Without --database-url it starts a throwaway PostgreSQL that is durable, as in
production (fsync, synchronous_commit and full_page_writes on); --fsync off trades that
for speed. With --database-url the server's own settings apply, and the user must be
allowed to CREATE DATABASE.

The realistic checkout (an order, three lines, a stock decrement per line) and the
scale case reach the database through a proxy adding --network-delay to each message
in each direction, as a network in one zone does; 0 connects directly. The micro
checkout and the other cases run over loopback. --explain adds a per-workflow
breakdown of what onceflow and the floor cost: round trips, commits, WAL bytes, server
time per statement, rows written, client CPU (see docs/benchmarks.md).`,
		Example: `  onceflow bench
  onceflow bench --rounds 10 --explain
  onceflow bench --case realistic --network-delay 1ms
  onceflow bench --case "claim latency by table size" --large-table 10000000`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch fsync {
			case "on":
			case "off":
				cfg.NoFsync = true
			default:
				return usageError{fmt.Errorf("--fsync must be on or off, not %q", fsync)}
			}
			if cfg.NetworkDelay < 0 {
				return usageError{fmt.Errorf("--network-delay must not be negative")}
			}
			cfg.DatabaseURL = opts.databaseURL
			if self, err := os.Executable(); err == nil {
				cfg.Worker = []string{self, "bench-worker"}
			}
			cfg.Logger = slog.New(slog.NewTextHandler(opts.stderr, nil))
			report, err := bench.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if asJSON {
				err = report.WriteJSON(opts.stdout)
			} else {
				err = report.WriteTable(opts.stdout)
			}
			if err == nil && check && !report.Passed() {
				err = errors.New("some figures missed their targets")
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&check, "check", false, "exit 1 when a figure misses its target")
	cmd.Flags().DurationVar(&cfg.Round, "round", time.Second, "how long each side of a throughput round runs")
	cmd.Flags().IntVar(&cfg.Rounds, "rounds", 5, "how many times the two sides of a throughput figure alternate")
	cmd.Flags().StringSliceVar(&cfg.Cases, "case", nil, "run only these cases: "+strings.Join(bench.CaseNames(), ", "))
	cmd.Flags().IntVar(&cfg.LargeTable, "large-table", 1_000_000, "records in the large table of the claim-latency figure")
	cmd.Flags().StringVar(&fsync, "fsync", "on", "on: the throwaway server is durable; off: fsync and full_page_writes off")
	cmd.Flags().DurationVar(&cfg.NetworkDelay, "network-delay", bench.NetworkDelayDefault,
		"one-way delay the proxy adds between application and database in the realistic and scale cases; 0 connects directly")
	cmd.Flags().BoolVar(&cfg.Explain, "explain", false, "add the per-workflow breakdown of onceflow's and the floor's costs")
	return cmd
}
