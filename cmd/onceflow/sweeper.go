package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/sweeper"
)

type sweeperFlags struct {
	pruneEvery, reportEvery string
	retention, outboxRet    time.Duration
	processedRet            time.Duration
	abandonedRet            time.Duration
	batchSize               int
	metricsAddr             string
	once                    bool
}

func newSweeper(opts *options) *cobra.Command {
	var f sweeperFlags
	cmd := &cobra.Command{
		Use:   "sweeper",
		Short: "Prune finished keys and report abandoned ones, until stopped",
		Long: `sweeper runs the maintenance that needs no workflow code: it prunes keys that
finished longer ago than the retention (and delivered outbox messages, and consumers'
records of processed messages that no redelivery can reach any more), and reports
records in flight whose lease expired, which the binary holding their workflows must
resume (its own sweeper.Completer does). Metrics and a health check are served on
--metrics-addr. SIGINT or SIGTERM stops it gracefully.

Schedules are cron specs ("*/5 * * * *") or descriptors ("@every 1m", "@hourly").`,
		Example: `  onceflow sweeper --retention 48h --metrics-addr :9464
  onceflow sweeper --once`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return runSweeper(cmd.Context(), opts, f) },
	}
	cmd.Flags().StringVar(&f.pruneEvery, "prune-every", "@every 1m", "when to prune")
	cmd.Flags().StringVar(&f.reportEvery, "report-every", "@every 30s", "when to report abandoned records and the oldest in flight")
	cmd.Flags().DurationVar(&f.retention, "retention", sweeper.RetentionDefault, "keep finished keys this long")
	cmd.Flags().DurationVar(&f.outboxRet, "outbox-retention", 0, "keep delivered outbox messages this long (default: --retention; -1ns keeps them)")
	cmd.Flags().DurationVar(&f.processedRet, "processed-retention", 0,
		"keep consumers' records of processed outbox messages this long, and while a message with their dedupe key is pending or dead (default: --outbox-retention; -1ns keeps them)")
	cmd.Flags().DurationVar(&f.abandonedRet, "abandoned-retention", 0,
		"also delete keys in flight that store no request (HTTP middleware claims) whose lease ended longer ago than this (default: keep them)")
	cmd.Flags().IntVar(&f.batchSize, "batch-size", sweeper.PruneBatchDefault, "rows one prune statement deletes at most")
	cmd.Flags().StringVar(&f.metricsAddr, "metrics-addr", "", "serve /metrics and /healthz on this address, e.g. :9464")
	cmd.Flags().BoolVar(&f.once, "once", false, "run each task once and exit")
	return cmd
}

func runSweeper(ctx context.Context, opts *options, f sweeperFlags) error {
	if f.retention <= 0 || f.batchSize <= 0 {
		return usageError{errors.New("--retention and --batch-size must be positive")}
	}
	db, err := opts.connect(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	logger := slog.New(slog.NewTextHandler(opts.stderr, nil))
	m := metrics.New()
	pruner, err := sweeper.NewPruner(db, sweeper.PrunerConfig{Schema: opts.schema, Retention: f.retention,
		OutboxRetention: f.outboxRet, ProcessedRetention: f.processedRet, AbandonedRetention: f.abandonedRet,
		BatchSize: f.batchSize, Logger: logger, Observer: m})
	if err != nil {
		return usageError{err}
	}
	reporter, err := sweeper.NewCompleter(db, nil, sweeper.CompleterConfig{Schema: opts.schema, Logger: logger, Observer: m})
	if err != nil {
		return usageError{err}
	}
	s, err := sweeper.New(sweeper.Config{Logger: logger, Observer: m, Tasks: []sweeper.Scheduled{
		{Schedule: f.pruneEvery, Task: pruner},
		{Schedule: f.reportEvery, Task: reporter},
	}})
	if err != nil {
		return usageError{err}
	}
	if f.once {
		return s.RunNow(ctx)
	}

	var srv *http.Server
	if f.metricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", m.Handler())
		mux.Handle("/healthz", sweeper.Health(db))
		listener, err := net.Listen("tcp", f.metricsAddr)
		if err != nil {
			return fmt.Errorf("metrics address: %w", err)
		}
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(listener) }()
		logger.Info("serving metrics and health", slog.String("addr", listener.Addr().String()))
	}
	if err := s.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	logger.Info("stopping")
	s.Stop()
	if srv != nil {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}
	return nil
}
