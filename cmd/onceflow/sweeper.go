package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/admin"
	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/sweeper"
)

type sweeperFlags struct {
	pruneEvery, reportEvery string
	retention, outboxRet    time.Duration
	processedRet            time.Duration
	abandonedRet            time.Duration
	batchSize               int
	metricsAddr             string
	adminAddr, adminTokens  string
	once                    bool
}

func newSweeper(opts *options) *cobra.Command {
	var f sweeperFlags
	cmd := &cobra.Command{
		Use:   "sweeper",
		Short: "Prune finished keys and report abandoned and parked ones, until stopped",
		Long: `sweeper runs the maintenance that needs no workflow code: it prunes keys that
finished longer ago than the retention (and delivered outbox messages, and consumers'
records of processed messages that no redelivery can reach any more), and reports
records in flight whose lease expired, which the binary holding their workflows must
resume (its own sweeper.Completer does), and parked records, which wait for an
operator (keys resume, release or fail). Metrics and a health check are served on
--metrics-addr. SIGINT or SIGTERM stops it gracefully.

--admin-addr serves the web console and the admin JSON API (see docs/admin.md) to
the operators whose tokens --admin-tokens lists, one "TOKEN ROLE" a line, ROLE read
or write, a token at least 24 characters. Programs send a token as a bearer token;
a browser asks for it as the password (any user name). There is no default: the
console needs the tokens file.

Schedules are cron specs ("*/5 * * * *") or descriptors ("@every 1m", "@hourly").`,
		Example: `  onceflow sweeper --retention 48h --metrics-addr :9464
  onceflow sweeper --admin-addr 127.0.0.1:9465 --admin-tokens /etc/onceflow/operators
  onceflow sweeper --once`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return runSweeper(cmd.Context(), opts, f) },
	}
	cmd.Flags().StringVar(&f.pruneEvery, "prune-every", "@every 1m", "when to prune")
	cmd.Flags().StringVar(&f.reportEvery, "report-every", "@every 30s", "when to report abandoned and parked records and the oldest in flight")
	cmd.Flags().DurationVar(&f.retention, "retention", sweeper.RetentionDefault, "keep finished keys this long")
	cmd.Flags().DurationVar(&f.outboxRet, "outbox-retention", 0, "keep delivered outbox messages this long (default: --retention; -1ns keeps them)")
	cmd.Flags().DurationVar(&f.processedRet, "processed-retention", 0,
		"keep consumers' records of processed outbox messages this long, and while a message with their dedupe key is pending or dead (default: --outbox-retention; -1ns keeps them)")
	cmd.Flags().DurationVar(&f.abandonedRet, "abandoned-retention", 0,
		"also delete keys in flight that store no request (HTTP middleware claims) whose lease ended longer ago than this (default: keep them)")
	cmd.Flags().IntVar(&f.batchSize, "batch-size", sweeper.PruneBatchDefault, "rows one prune statement deletes at most")
	cmd.Flags().StringVar(&f.metricsAddr, "metrics-addr", "", "serve /metrics and /healthz on this address, e.g. :9464")
	cmd.Flags().StringVar(&f.adminAddr, "admin-addr", "", "serve the web console and the admin API on this address, e.g. 127.0.0.1:9465 (needs --admin-tokens)")
	cmd.Flags().StringVar(&f.adminTokens, "admin-tokens", "", `file of the operators' tokens for --admin-addr: each line "TOKEN ROLE", ROLE read or write`)
	cmd.Flags().BoolVar(&f.once, "once", false, "run each task once and exit")
	return cmd
}

func runSweeper(ctx context.Context, opts *options, f sweeperFlags) error {
	if f.retention <= 0 || f.batchSize <= 0 {
		return usageError{errors.New("--retention and --batch-size must be positive")}
	}
	var tokens *admin.Tokens
	switch {
	case f.adminAddr != "" && f.adminTokens == "":
		return usageError{errors.New("--admin-addr needs --admin-tokens: the console acts on every key, and nobody may use it without a token")}
	case f.adminAddr != "" && f.once:
		return usageError{errors.New("--admin-addr serves until stopped; --once exits after one run")}
	case f.adminAddr != "":
		var err error
		if tokens, err = admin.LoadTokens(f.adminTokens); err != nil {
			return usageError{err}
		}
	}
	db, err := opts.connect(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := checkMigrated(ctx, db, opts.schema); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(opts.stderr, nil))
	m := metrics.New()
	var observer sweeper.Observer = m
	var done *summary
	if f.once {
		done = &summary{Observer: m, pruned: map[string]int{}, abandoned: map[string]int{}, parked: map[string]int{}}
		observer = done
	}
	pruner, err := sweeper.NewPruner(db, sweeper.PrunerConfig{Schema: opts.schema, Retention: f.retention,
		OutboxRetention: f.outboxRet, ProcessedRetention: f.processedRet, AbandonedRetention: f.abandonedRet,
		BatchSize: f.batchSize, Logger: logger, Observer: observer})
	if err != nil {
		return usageError{err}
	}
	reporter, err := sweeper.NewCompleter(db, nil, sweeper.CompleterConfig{Schema: opts.schema, Logger: logger, Observer: observer})
	if err != nil {
		return usageError{err}
	}
	s, err := sweeper.New(sweeper.Config{Logger: logger, Observer: observer, Tasks: []sweeper.Scheduled{
		{Schedule: f.pruneEvery, Task: pruner},
		{Schedule: f.reportEvery, Task: reporter},
	}})
	if err != nil {
		return usageError{err}
	}
	if f.once {
		if err := s.RunNow(ctx); err != nil {
			return err
		}
		done.print(opts.stdout)
		return nil
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
		srv = newServer(mux)
		go func() { _ = srv.Serve(listener) }()
		logger.Info("serving metrics and health", slog.String("addr", listener.Addr().String()))
	}
	if tokens != nil {
		console, err := serveConsole(db, opts.schema, tokens, f.adminAddr, logger)
		if err != nil {
			return err
		}
		defer shutdown(console)
	}
	if err := s.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	logger.Info("stopping")
	s.Stop()
	if srv != nil {
		shutdown(srv)
	}
	return nil
}

// serveConsole serves the web console and the admin API on addr, to the
// operators tokens lets in.
func serveConsole(db *pgxpool.Pool, schema string, tokens *admin.Tokens, addr string, logger *slog.Logger) (*http.Server, error) {
	a, err := admin.New(db, admin.Config{Schema: schema, Authorize: tokens.Authorize, Logger: logger})
	if err != nil {
		return nil, usageError{err}
	}
	listener, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin address: %w", err)
	}
	srv := newServer(admin.Challenge("onceflow", a.Handler()))
	go func() { _ = srv.Serve(listener) }()
	logger.Info("serving the admin console", slog.String("addr", listener.Addr().String()))
	return srv, nil
}

// The limits of the sweeper's HTTP servers (metrics, console): what one
// client can make a server hold, a connection and a goroutine, is bounded
// in time, however slowly it sends its request or reads the answer.
const (
	// serverReadTimeout bounds the time to send a request, body included
	// (the console's are at most admin.MaxBodyBytes); its headers get
	// serverHeaderTimeout of it. Without it a client that sends a POST's
	// headers and not its body holds the connection for ever: the server
	// waits for the body it means to discard, even after a 401.
	serverReadTimeout   = 10 * time.Second
	serverHeaderTimeout = 5 * time.Second
	// serverWriteTimeout bounds a request from its headers read to its
	// answer written, a bulk action of the console included.
	serverWriteTimeout = 2 * time.Minute
	// serverIdleTimeout bounds a kept-alive connection's wait for its next
	// request.
	serverIdleTimeout = 2 * time.Minute
	// serverMaxHeaderBytes bounds a request's headers.
	serverMaxHeaderBytes = 64 << 10
)

// newServer is an HTTP server of h within the limits above.
func newServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: serverHeaderTimeout, ReadTimeout: serverReadTimeout,
		WriteTimeout: serverWriteTimeout, IdleTimeout: serverIdleTimeout, MaxHeaderBytes: serverMaxHeaderBytes}
}

// shutdown stops srv, waiting a few seconds for the requests it serves.
func shutdown(srv *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
}

// checkMigrated refuses to start on a schema behind this build, with the
// error that says which command migrates it.
func checkMigrated(ctx context.Context, db *pgxpool.Pool, schema string) error {
	m, err := migrations.New(db, migrations.Config{Schema: schema})
	if err != nil {
		return usageError{err}
	}
	return m.Check(ctx)
}

// summary is what one run of the tasks did (sweeper --once), as the tasks
// report it to their observer.
type summary struct {
	sweeper.Observer
	mu        sync.Mutex
	pruned    map[string]int // rows per table
	abandoned map[string]int // records per workflow
	parked    map[string]int // records per workflow
	oldest    time.Duration
}

func (s *summary) Pruned(table string, rows int) {
	s.Observer.Pruned(table, rows)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruned[table] += rows
}

func (s *summary) Abandoned(workflow string, records int) {
	s.Observer.Abandoned(workflow, records)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.abandoned[workflow] = records
}

func (s *summary) ParkedRecords(workflow string, records int) {
	s.Observer.ParkedRecords(workflow, records)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.parked[workflow] = records
}

func (s *summary) OldestInFlight(age time.Duration) {
	s.Observer.OldestInFlight(age)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.oldest = age
}

// print writes four lines: what was pruned, the abandoned records that
// another binary must resume, the parked records that wait for an
// operator, and the age of the oldest key in flight.
func (s *summary) print(w io.Writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(w, "pruned: %s\n", counts(s.pruned, "nothing"))
	fmt.Fprintf(w, "abandoned (resume them where their workflows are defined): %s\n", counts(s.abandoned, "none"))
	fmt.Fprintf(w, "parked (see onceflow keys list --status parked): %s\n", counts(s.parked, "none"))
	oldest := "none in flight"
	if s.oldest > 0 {
		oldest = s.oldest.Round(time.Second).String()
	}
	fmt.Fprintf(w, "oldest key in flight: %s\n", oldest)
}

// counts lists "name n" pairs in name order, or none when all are 0.
func counts(m map[string]int, none string) string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(m)) {
		if m[name] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", m[name], name))
		}
	}
	if len(parts) == 0 {
		return none
	}
	return strings.Join(parts, ", ")
}
