package main

import (
	"errors"
	"log/slog"
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
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure onceflow against the bare-SQL floor and print the table",
		Long: `bench runs each case against onceflow and against its floor, the same business
statements in the same transactions without onceflow, in alternation on the same
PostgreSQL, and prints each figure as a ratio against its floor, or a count, with its
target. Without --database-url it starts a throwaway PostgreSQL with durable commits;
with one, the user must be allowed to CREATE DATABASE.`,
		Example: `  onceflow bench
  onceflow bench --json --rounds 10`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.DatabaseURL = opts.databaseURL
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
	return cmd
}
