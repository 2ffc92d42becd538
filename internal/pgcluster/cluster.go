package pgcluster

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartTimeoutDefault bounds how long Start waits for a new server to accept
// connections.
const StartTimeoutDefault = 60 * time.Second

// Options configures a throwaway cluster. The zero value is ready to use.
type Options struct {
	// Settings are extra server settings passed as -c name=value; they
	// override the defaults, which favour speed over durability (fsync off):
	// a throwaway cluster has nothing to keep.
	Settings map[string]string

	// StartTimeout bounds the wait for the server to accept connections.
	// 0 means StartTimeoutDefault.
	StartTimeout time.Duration

	// Logger receives one line when the cluster starts and one when it
	// stops. nil discards them.
	Logger *slog.Logger
}

// defaultSettings trade durability for speed and allow many test connections.
var defaultSettings = map[string]string{
	"listen_addresses":                    "127.0.0.1",
	"fsync":                               "off",
	"full_page_writes":                    "off",
	"synchronous_commit":                  "off",
	"max_connections":                     "300",
	"shared_buffers":                      "64MB",
	"log_min_messages":                    "warning",
	"max_locks_per_transaction":           "256",
	"idle_in_transaction_session_timeout": "0",
}

// Cluster is a running throwaway PostgreSQL server.
type Cluster struct {
	url    string
	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
	logger *slog.Logger

	stopOnce sync.Once
	stopErr  error
}

// URL is a connection string for the cluster's "postgres" superuser and
// database.
func (c *Cluster) URL() string { return c.url }

// Start initialises a cluster in a new temporary directory and starts its
// server on a free loopback port. Call Stop to shut it down and remove it.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "onceflow-pg-")
	if err != nil {
		return nil, fmt.Errorf("create cluster directory: %w", err)
	}
	if err := initCluster(ctx, bin, dir, cred); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	// A free port can be taken between choosing and binding it; try again.
	for attempt := 0; ; attempt++ {
		c, err := startServer(ctx, bin, dir, cred, opts, logger)
		if err == nil {
			logger.Info("throwaway PostgreSQL started", slog.String("dir", dir), slog.String("bin", bin))
			return c, nil
		}
		if attempt < 3 && errors.Is(err, errPortTaken) {
			continue
		}
		_ = os.RemoveAll(dir)
		return nil, err
	}
}

// serverCredential returns the credential to run the server with: nil for a
// normal user, the "postgres" user's when running as root.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, the server must run as the postgres user, which does not exist: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres user id %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres group id %q: %w", u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func initCluster(ctx context.Context, bin, dir string, cred *syscall.Credential) error {
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("hand cluster directory to postgres: %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", filepath.Join(dir, "data"), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--no-locale", "--no-sync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, lastLines(out, 10))
	}
	return nil
}

var errPortTaken = errors.New("port taken")

func startServer(ctx context.Context, bin, dir string, cred *syscall.Credential, opts Options, logger *slog.Logger) (*Cluster, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	args := []string{"-D", filepath.Join(dir, "data"), "-p", strconv.Itoa(port), "-k", dir}
	for name, value := range mergeSettings(opts.Settings) {
		args = append(args, "-c", name+"="+value)
	}
	logPath := filepath.Join(dir, "server.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create server log: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	c := &Cluster{
		url:    fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		dir:    dir,
		cmd:    cmd,
		exited: make(chan struct{}),
		logger: logger,
	}
	go func() { _ = cmd.Wait(); close(c.exited) }()

	if err := c.waitReady(ctx, cmp.Or(opts.StartTimeout, StartTimeoutDefault)); err != nil {
		c.kill()
		log, _ := os.ReadFile(logPath)
		if bytes.Contains(log, []byte("Address already in use")) {
			return nil, errPortTaken
		}
		return nil, fmt.Errorf("%w; server log: %s", err, lastLines(log, 10))
	}
	return c, nil
}

func mergeSettings(extra map[string]string) map[string]string {
	merged := maps.Clone(defaultSettings)
	maps.Copy(merged, extra)
	return merged
}

func (c *Cluster) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		connCtx, connCancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(connCtx, c.url)
		connCancel()
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-c.exited:
			return errors.New("postgres exited during start")
		case <-ctx.Done():
			return fmt.Errorf("postgres did not accept connections within %s: %w", timeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop shuts the server down (fast shutdown, then a kill after 10s) and
// removes the cluster's directory. It is safe to call more than once.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		_ = c.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			c.kill()
		}
		c.stopErr = os.RemoveAll(c.dir)
		c.logger.Info("throwaway PostgreSQL stopped", slog.String("dir", c.dir))
	})
	return c.stopErr
}

func (c *Cluster) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exited
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
