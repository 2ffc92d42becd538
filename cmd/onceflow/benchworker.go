package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/internal/bench"
)

// newBenchWorker is the hidden command bench runs as each application
// process of its scale case.
func newBenchWorker(opts *options) *cobra.Command {
	var cfg bench.WorkerConfig
	cmd := &cobra.Command{
		Use:    "bench-worker",
		Short:  "Run one application process of bench's scale case (bench starts it)",
		Hidden: true,
		Args:   args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.DatabaseURL = os.Getenv(bench.WorkerURLEnv)
			return bench.RunWorker(cmd.Context(), cfg, os.Stdin, opts.stdout)
		},
	}
	cmd.Flags().DurationVar(&cfg.NetworkDelay, "network-delay", 0, "one-way delay of the worker's proxy to the database")
	cmd.Flags().IntVar(&cfg.Concurrency, "concurrency", 8, "workflows at once")
	cmd.Flags().StringVar(&cfg.ID, "id", "w", "unique among the workers: a prefix of the keys")
	return cmd
}
