package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/internal/dbschema"
	"github.com/onceflow/onceflow/internal/pgcluster"
)

// options are the flags every command shares.
type options struct {
	databaseURL string
	schema      string
	verbose     bool
	stdout      io.Writer
	stderr      io.Writer
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	opts := &options{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "onceflow",
		Short: "Operate onceflow: exactly-once effects on PostgreSQL",
		Long: `onceflow operates the tables of the onceflow library: it migrates them, runs a
sweeper that prunes finished keys and reports abandoned and parked ones, lets an
operator inspect and unstick idempotency keys and outbox messages, and checks a
deploy's workflow definitions against the ones in flight.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// The schema is checked before anything connects: it is written into SQL.
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if _, err := dbschema.Resolve(opts.schema); err != nil {
			return usageError{fmt.Errorf("--schema: %w", err)}
		}
		return nil
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	flags := root.PersistentFlags()
	flags.StringVar(&opts.databaseURL, "database-url", "", "PostgreSQL URL (default: $"+pgcluster.URLEnv+")")
	flags.StringVar(&opts.schema, "schema", "", `schema holding onceflow's tables (default "public")`)
	flags.BoolVarP(&opts.verbose, "verbose", "v", false, "log what happens on standard error")
	root.AddCommand(newMigrate(opts), newSweeper(opts), newKeys(opts), newOutbox(opts), newWorkflows(opts), newBench(opts),
		newBenchWorker(opts))
	root.AddCommand(newDocs(root, opts))
	return root
}

// connect opens a pool to the database the flags or the environment name.
func (o *options) connect(ctx context.Context) (*pgxpool.Pool, error) {
	url := o.databaseURL
	if url == "" {
		url = pgcluster.URLFromEnv()
	}
	if url == "" {
		return nil, usageError{errors.New("no database: pass --database-url or set " + pgcluster.URLEnv)}
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, usageError{fmt.Errorf("database URL: %w", err)}
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to the database: %w", err)
	}
	return pool, nil
}

func (o *options) logger() *slog.Logger {
	if !o.verbose {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(o.stderr, nil))
}

// group makes cmd a group of subcommands: called alone, or with a
// subcommand it does not have, it is a usage error rather than a help page
// and a success.
func group(cmd *cobra.Command) *cobra.Command {
	cmd.Args = args(cobra.NoArgs)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		return usageError{fmt.Errorf("%s needs a subcommand; see %s --help", cmd.CommandPath(), cmd.CommandPath())}
	}
	return cmd
}

// limit checks a --limit flag.
func limit(n int) error {
	if n <= 0 {
		return usageError{fmt.Errorf("--limit must be positive, not %d", n)}
	}
	return nil
}

// args wraps cobra's argument checks so that a wrong count is a usage error.
func args(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if err := check(cmd, a); err != nil {
			return usageError{err}
		}
		return nil
	}
}
