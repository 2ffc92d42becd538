package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/pgcluster"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/sweeper"
	"github.com/onceflow/onceflow/workflow"
)

// crashExitCode is the exit code of --crash-after and --crash-at.
const crashExitCode = 3

type serveFlags struct {
	addr, databaseURL, providerURL, crashAfter, crashAt, stopAfter string
	lease, sweepEvery, dbTimeout                                   time.Duration
	apiKeys, operatorTokenFile, deriveKeysFrom                     string
	trustTenantHeader                                              bool
	limits                                                         serverLimits
}

// serve runs the checkout API until ctx ends.
func serve(ctx context.Context, f serveFlags, stdout, stderr io.Writer) error {
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	for flag, value := range map[string]string{"--crash-after": f.crashAfter, "--crash-at": f.crashAt} {
		if value != "" && (f.databaseURL == "" || f.providerURL == "") {
			return fmt.Errorf("%s needs --database-url and --provider-url: the throwaway database and the in-process provider die with the process, and the retry would find nothing to resume", flag)
		}
	}
	keySource, err := foreign.ParseKeySource(f.deriveKeysFrom)
	if err != nil {
		return fmt.Errorf("--derive-keys-from: %w", err)
	}
	auth, err := authFrom(f, stdout, logger)
	if err != nil {
		return err
	}
	ops, err := operatorsFrom(f)
	if err != nil {
		return err
	}
	// The port first: a port in use fails at once, not after PostgreSQL
	// has started.
	l, err := net.Listen("tcp", f.addr)
	if err != nil {
		return err
	}
	defer l.Close()
	url := f.databaseURL
	if url == "" {
		cluster, err := pgcluster.Start(ctx, pgcluster.Options{Logger: logger})
		if err != nil {
			return err
		}
		defer cluster.Stop()
		url = cluster.URL()
		// For the onceflow command line: keys list, outbox list, ...
		fmt.Fprintf(stdout, "export %s=%s\n", pgcluster.URLEnv, url)
	}
	db, err := openDatabase(ctx, url)
	if err != nil {
		return err
	}
	defer db.Close()
	providerURL := f.providerURL
	if providerURL == "" {
		srv, addr, err := listen(ctx, "127.0.0.1:0", newProvider().routes(), defaultLimits)
		if err != nil {
			return err
		}
		defer shutdown(srv)
		providerURL = "http://" + addr
		logger.Info("payment provider started in-process", slog.String("url", providerURL))
	}

	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		return err
	}
	a := &app{db: db, outbox: ob, provider: providerURL, client: &http.Client{Timeout: 10 * time.Second}, logger: logger}
	checkout := a.checkout()
	hooks, err := crashHooks(checkout, f, stderr)
	if err != nil {
		return err
	}
	engine, err := workflow.NewEngine(db, workflow.Config{Lease: f.lease, DBTimeout: f.dbTimeout, Hooks: hooks,
		DeriveKeysFrom: keySource, Logger: logger, Workflows: definitions(checkout)})
	if err != nil {
		return err
	}
	checkouts, err := idemhttp.Workflow(engine, checkout, idemhttp.WorkflowConfig{Logger: logger, Tenant: authenticatedTenant,
		MaxWait: maxWaitWithin(f.limits.write)})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/checkouts", authenticated(auth, checkouts))
	mux.Handle("GET /v1/orders/{order_id}", authenticated(auth, http.HandlerFunc(a.getOrder)))
	// Not behind the Idempotency-Key layer: If-Match makes it idempotent.
	mux.Handle("PATCH /v1/orders/{order_id}", authenticated(auth, http.HandlerFunc(a.patchOrder)))
	if err := mountConsole(mux, ops, db, engine, auth, logger); err != nil {
		return err
	}

	s, err := newSweeper(db, engine, a, f.sweepEvery, logger)
	if err != nil {
		return err
	}
	if err := s.Start(ctx); err != nil {
		return err
	}
	defer s.Stop()

	srv := serveOn(ctx, l, mux, f.limits)
	fmt.Fprintf(stdout, "listening on http://%s\n", l.Addr())
	<-ctx.Done()
	shutdown(srv)
	return nil
}

// authFrom is the authenticator the flags choose: the API keys of
// --api-keys, the header of --trust-tenant-header, or with neither one new
// API key for tenant demo, which it prints.
func authFrom(f serveFlags, stdout io.Writer, logger *slog.Logger) (authenticator, error) {
	switch {
	case f.apiKeys != "" && f.trustTenantHeader:
		return nil, errors.New("--api-keys and --trust-tenant-header exclude each other: the tenant comes from one or the other")
	case f.apiKeys != "":
		keys, err := loadAPIKeys(f.apiKeys)
		if err != nil {
			return nil, err
		}
		return keys.bearer, nil
	case f.trustTenantHeader:
		logger.Warn("the tenant is taken from the " + tenantHeader + " header: only a proxy that authenticates clients and sets it may reach this server")
		return trustedTenantHeader, nil
	}
	token := newAPIKey()
	keys := apiKeys{}
	if err := keys.add([]string{token, demoTenant}); err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "export CHECKOUT_API_KEY=%s\n", token)
	logger.Info("no --api-keys: made one API key, for tenant " + demoTenant + "; send it as Authorization: Bearer $CHECKOUT_API_KEY")
	return keys.bearer, nil
}

// demoTenant is the tenant of the API key serve makes when given none.
const demoTenant = "demo"

func openDatabase(ctx context.Context, url string) (*pgxpool.Pool, error) {
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	m, err := migrations.New(db, migrations.Config{})
	if err == nil {
		_, err = m.Up(ctx)
	}
	if err == nil {
		_, err = db.Exec(ctx, schemaSQL)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return db, nil
}

// newSweeper finishes abandoned checkouts, delivers receipts and prunes.
func newSweeper(db *pgxpool.Pool, engine *workflow.Engine, a *app, every time.Duration, logger *slog.Logger) (*sweeper.Sweeper, error) {
	relay, err := outbox.NewRelay(db, outbox.RelayConfig{Logger: logger,
		Handlers: map[string]outbox.Handler{"receipt": a.sendReceipt}})
	if err != nil {
		return nil, err
	}
	completer, err := sweeper.NewCompleter(db, engine, sweeper.CompleterConfig{Logger: logger})
	if err != nil {
		return nil, err
	}
	pruner, err := sweeper.NewPruner(db, sweeper.PrunerConfig{Logger: logger})
	if err != nil {
		return nil, err
	}
	schedule := "@every " + every.String()
	return sweeper.New(sweeper.Config{Logger: logger, Jitter: min(every/4, sweeper.JitterDefault), Tasks: []sweeper.Scheduled{
		{Schedule: schedule, Task: completer},
		{Schedule: schedule, Task: sweeper.RelayTask(relay)},
		{Schedule: "@every 1h", Task: pruner},
	}})
}

// crashHooks makes the process exit at once, with no cleanup, right after
// the step f.crashAfter has finished: after its commit, or for a foreign
// step after its call returned (before its result is committed); or at the
// crash point f.crashAt names. At the same point of the step f.stopAfter,
// the process stops itself (SIGSTOP), once, until it gets a SIGCONT: a
// test's way to pause an owner where no transaction, call or timer of its
// attempt is under way.
func crashHooks(wf workflow.Definition, f serveFlags, stderr io.Writer) (*workflow.Hooks, error) {
	if f.crashAfter != "" && f.crashAt != "" {
		return nil, errors.New("--crash-after and --crash-at exclude each other: the process dies once")
	}
	crash, err := pointAfter(wf, "--crash-after", f.crashAfter)
	if err == nil && f.crashAt != "" {
		crash, err = pointNamed(wf, f.crashAt)
	}
	if err != nil {
		return nil, err
	}
	stop, err := pointAfter(wf, "--stop-after", f.stopAfter)
	if err != nil {
		return nil, err
	}
	if crash == (workflow.CrashPoint{}) && stop == (workflow.CrashPoint{}) {
		return nil, nil
	}
	var stopped atomic.Bool
	return &workflow.Hooks{CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
		switch {
		case p == crash:
			fmt.Fprintf(stderr, "crashing %s, as asked\n", p)
			os.Exit(crashExitCode)
		case p == stop && stopped.CompareAndSwap(false, true):
			fmt.Fprintf(stderr, "stopping %s, as asked\n", p)
			stopUntilContinued()
		}
		return nil
	}}, nil
}

// stopUntilContinued stops the process with SIGSTOP and returns once it got
// SIGCONT. A signal to itself stops the process a moment later, not at once:
// waiting for the SIGCONT keeps the caller from going on in that moment.
func stopUntilContinued() {
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	defer signal.Stop(cont)
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	<-cont
}

// pointAfter is the crash point right after step; the zero CrashPoint,
// which no attempt passes, when step is "".
func pointAfter(wf workflow.Definition, flag, step string) (workflow.CrashPoint, error) {
	if step == "" {
		return workflow.CrashPoint{}, nil
	}
	var names []string
	kind := phase.Kind(0)
	for _, s := range wf.Steps() {
		names = append(names, s.Name)
		if s.Name == step {
			kind = s.Kind
		}
	}
	if !slices.Contains(names, step) {
		return workflow.CrashPoint{}, fmt.Errorf("%s %q: the steps are %v", flag, step, names)
	}
	point := workflow.CrashPoint{Kind: workflow.AfterCommit, Step: step}
	if kind == phase.KindForeign {
		point.Kind = workflow.AfterForeignCall
	}
	return point, nil
}

// pointNamed is the crash point of wf that name describes
// (CrashPoint.String): a point of a run, or of its compensation.
func pointNamed(wf workflow.Definition, name string) (workflow.CrashPoint, error) {
	points := append(workflow.CrashPoints(wf), workflow.CompensationPoints(wf)...)
	var names []string
	for _, p := range points {
		if p.String() == name {
			return p, nil
		}
		names = append(names, strconv.Quote(p.String()))
	}
	return workflow.CrashPoint{}, fmt.Errorf("--crash-at %q: the crash points are %s", name, strings.Join(names, ", "))
}

// serverLimits bound what a client can make a server hold: a connection
// for a request sent slowly, or a response read slowly.
type serverLimits struct {
	// read is how long a client may take to send a request, headers and
	// body; the headers alone get at most maxHeaderWait of it.
	read time.Duration
	// write is how long a request may take from its headers read to its
	// answer written: the checkout's work included.
	write time.Duration
}

// defaultLimits are serve's defaults, and the fake provider's.
var defaultLimits = serverLimits{read: 30 * time.Second, write: 2 * time.Minute}

const (
	// maxHeaderWait bounds the time to send a request's headers.
	maxHeaderWait = 10 * time.Second
	// idleTimeout is how long a kept-alive connection may wait for its
	// next request.
	idleTimeout = 2 * time.Minute
	// maxHeaderBytes bounds a request's headers (the default is 1 MiB).
	maxHeaderBytes = 64 << 10
)

// maxWaitWithin is how long a checkout may wait for its key in flight
// (Prefer: wait): idemhttp.MaxWaitDefault, but at most half the write
// timeout, in whole seconds, so that the answer after the wait is written
// before the server cuts the connection; no wait (-1) when that is under a
// second. A write timeout of 0 or less is none: the default.
func maxWaitWithin(write time.Duration) time.Duration {
	if write <= 0 {
		return idemhttp.MaxWaitDefault
	}
	if wait := (write / 2).Truncate(time.Second); wait >= time.Second {
		return min(idemhttp.MaxWaitDefault, wait)
	}
	return -1
}

// listen serves h on addr, within limits, and returns the server and the
// address it got.
func listen(ctx context.Context, addr string, h http.Handler, limits serverLimits) (*http.Server, string, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", err
	}
	return serveOn(ctx, l, h, limits), l.Addr().String(), nil
}

// serveOn serves h on l, within limits, and returns the server.
func serveOn(ctx context.Context, l net.Listener, h http.Handler, limits serverLimits) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: min(limits.read, maxHeaderWait),
		ReadTimeout:       limits.read,
		WriteTimeout:      limits.write,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("server stopped", slog.Any("error", err))
		}
	}()
	return srv
}

func shutdown(srv *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
}
