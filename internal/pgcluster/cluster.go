package pgcluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/onceflow/onceflow/internal/child"
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

	// Env holds extra environment variables for the server, as
	// NAME=value, added to this process's environment (where a name is in
	// both, Env's value wins). nil adds none. Tests use it to change what
	// the server sees, such as its clock through a preloaded library.
	Env []string

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

// Cluster is a throwaway PostgreSQL server: running from Start, halted
// between Halt and Resume, gone after Stop.
type Cluster struct {
	url    string
	dir    string
	logger *slog.Logger
	launch launchParams // how to start the server again on Resume

	mu      sync.Mutex
	server  *child.Process // nil while halted or stopped
	stopped bool
	stopErr error
}

// Dir is the cluster's private directory: its data directory, Unix socket
// and server log.
func (c *Cluster) Dir() string { return c.dir }

// URL is a connection string for the cluster's "postgres" superuser and
// database.
func (c *Cluster) URL() string { return c.url }

// Start initialises a cluster in a new temporary directory and starts its
// server on a free loopback port. Call Stop to shut it down and remove it;
// Halt and Resume take the server down and bring it back in between.
//
// The superuser has a random password for TCP connections; the Unix socket
// in the cluster's private directory needs none. If this process dies
// without calling Stop, the server gets SIGQUIT (immediate shutdown) and a
// later Start removes the directory.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cred, err := ServerCredential()
	if err != nil {
		return nil, err
	}
	removeStale(logger)
	dir, err := newClusterDir()
	if err != nil {
		return nil, err
	}
	password := child.RandomHex(24)
	if err := initCluster(ctx, bin, dir, password, cred); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	// A free port can be taken between choosing and binding it; try again.
	for attempt := 0; ; attempt++ {
		port, err := child.FreePort()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		c := newCluster(password, launchParams{bin: bin, dir: dir, port: port, cred: cred,
			settings: mergeSettings(opts.Settings), env: opts.Env, timeout: cmp.Or(opts.StartTimeout, StartTimeoutDefault)}, logger)
		c.server, err = startServer(ctx, c.launch, c.url)
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

func newCluster(password string, launch launchParams, logger *slog.Logger) *Cluster {
	return &Cluster{
		url: (&url.URL{
			Scheme: "postgres", User: url.UserPassword("postgres", password),
			Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(launch.port)), Path: "/postgres", RawQuery: "sslmode=disable",
		}).String(),
		dir:    launch.dir,
		logger: logger,
		launch: launch,
	}
}

// ServerCredential returns the credential to run PostgreSQL's programs
// with: nil for a normal user, the "postgres" user's when running as root,
// because the server refuses to run as root.
func ServerCredential() (*syscall.Credential, error) {
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

// initCluster runs initdb: trust on the Unix socket, which only the owner
// of the 0700 directory can reach, and the password for TCP.
func initCluster(ctx context.Context, bin, dir, password string, cred *syscall.Credential) error {
	pwfile := filepath.Join(dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(password+"\n"), 0o600); err != nil {
		return fmt.Errorf("write password file: %w", err)
	}
	defer os.Remove(pwfile)
	if cred != nil {
		for _, path := range []string{dir, pwfile} {
			if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
				return fmt.Errorf("hand cluster directory to postgres: %w", err)
			}
		}
	}
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", filepath.Join(dir, "data"), "-U", "postgres", "--pwfile", pwfile,
		"--auth-local=trust", "--auth-host=scram-sha-256",
		"-E", "UTF8", "--no-locale", "--no-sync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, child.LastLines(out, 10))
	}
	return nil
}

func mergeSettings(extra map[string]string) map[string]string {
	merged := maps.Clone(defaultSettings)
	maps.Copy(merged, extra)
	return merged
}

// Stop shuts the server down, if it runs (fast shutdown, then a kill after
// 10s), and removes the cluster's directory. It is safe to call more than
// once, and after Halt.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return c.stopErr
	}
	c.stopped = true
	if c.server != nil {
		shutdown(c.server)
		c.server = nil
	}
	c.stopErr = os.RemoveAll(c.dir)
	c.logger.Info("throwaway PostgreSQL stopped", slog.String("dir", c.dir))
	return c.stopErr
}
