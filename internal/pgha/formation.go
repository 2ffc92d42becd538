package pgha

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/child"
	"github.com/onceflow/onceflow/internal/pgcluster"
)

// StartTimeoutDefault bounds how long Start waits for a formation: the
// monitor, the primary, and the standby copied from it and streaming.
const StartTimeoutDefault = 2 * time.Minute

// DatabaseDefault is the database Start creates for the application.
const DatabaseDefault = "onceflow"

// host is the address every node listens on and is known by.
const host = "127.0.0.1"

// ErrNoAutoFailover reports that pg_auto_failover is not installed for a
// PostgreSQL on this machine. Its message says how to install it.
var ErrNoAutoFailover = errors.New("pgha: pg_auto_failover is not installed: its pg_autoctl command " +
	"and its extension for the server's version are needed (Debian/Ubuntu: apt-get install " +
	"pg-auto-failover-cli postgresql-15-auto-failover, the latter for PostgreSQL 15)")

// ErrStopped reports a call on a formation that Stop removed.
var ErrStopped = errors.New("pgha: the formation was stopped and removed")

// Options configures a formation. The zero value is ready to use.
type Options struct {
	// Database is the database created for the application. "" means
	// DatabaseDefault.
	Database string

	// StartTimeout bounds how long Start waits for the formation. 0 means
	// StartTimeoutDefault.
	StartTimeout time.Duration

	// Logger receives one line when the formation starts and one when it
	// stops. nil discards them.
	Logger *slog.Logger
}

// Formation is a pg_auto_failover formation on this machine: a monitor and
// two data nodes, running from Start, gone after Stop.
type Formation struct {
	dir      string
	bin      string // PostgreSQL's programs, for the version with the extension
	autoctl  string
	cred     *syscall.Credential
	env      []string // pg_autoctl's environment
	database string
	logger   *slog.Logger

	monitor *Node
	nodes   []*Node

	mu      sync.Mutex // guards the nodes' keepers, stopped and stopErr
	stopped bool
	stopErr error
}

// Node is one PostgreSQL node of a formation: its name at the monitor and
// its port.
type Node struct {
	Name string
	Port int

	pgdata string
	log    string
	keeper *child.Process // nil while the node is down
}

// Start builds a formation in a new temporary directory: the monitor, with
// health checks fast enough for tests, then a primary, then a standby
// copied from it. It returns once the standby is a synchronous secondary.
// Call Stop to shut everything down and remove it.
func Start(ctx context.Context, opts Options) (*Formation, error) {
	logger := cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))
	autoctl, err := exec.LookPath("pg_autoctl")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoAutoFailover, err)
	}
	bin, err := pgcluster.FindBinariesWith(hasExtension)
	if errors.Is(err, pgcluster.ErrNoServer) {
		return nil, fmt.Errorf("%w: no PostgreSQL server binaries with the pgautofailover extension", ErrNoAutoFailover)
	}
	if err != nil {
		return nil, err
	}
	cred, err := pgcluster.ServerCredential()
	if err != nil {
		return nil, err
	}
	if err := ensureSocketDirs(bin, cred); err != nil {
		return nil, err
	}
	removeStale(logger)
	dir, err := newFormationDir(cred)
	if err != nil {
		return nil, err
	}
	f := &Formation{dir: dir, bin: bin, autoctl: autoctl, cred: cred, env: autoctlEnv(dir),
		database: cmp.Or(opts.Database, DatabaseDefault), logger: logger}
	if err := f.build(ctx, cmp.Or(opts.StartTimeout, StartTimeoutDefault)); err != nil {
		_ = f.Stop()
		return nil, err
	}
	logger.Info("pg_auto_failover formation started", slog.String("dir", dir), slog.String("bin", bin))
	return f, nil
}

// hasExtension reports whether the server whose programs are in bin has
// the pgautofailover extension installed.
func hasExtension(bin string) bool {
	out, err := exec.Command(filepath.Join(bin, "pg_config"), "--sharedir").Output()
	if err != nil {
		return false
	}
	_, err = os.Stat(filepath.Join(strings.TrimSpace(string(out)), "extension", "pgautofailover.control"))
	return err == nil
}

// autoctlEnv is pg_autoctl's environment: its configuration, state and PID
// files in the formation's directory instead of the postgres user's home,
// and none of this process's PG* variables. The servers' Unix sockets are
// in the server's default directory (Debian: /var/run/postgresql), which
// pg_autoctl does not change (Start makes it when missing): each has its
// own port.
func autoctlEnv(dir string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "XDG_") && !strings.HasPrefix(kv, "HOME=") {
			env = append(env, kv)
		}
	}
	return append(env, "HOME="+dir, "XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(dir, "state"), "XDG_RUNTIME_DIR="+filepath.Join(dir, "run"))
}

// build starts the monitor, then the primary, then the standby.
func (f *Formation) build(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var ports [3]int
	for i := range ports {
		p, err := child.FreePort()
		if err != nil {
			return err
		}
		ports[i] = p
	}
	f.monitor = f.newNode("monitor", ports[0])
	if err := f.startKeeper(f.monitor, "create", "monitor", "--run", "--pgdata", f.monitor.pgdata,
		"--pgport", strconv.Itoa(f.monitor.Port), "--pgctl", filepath.Join(f.bin, "pg_ctl"),
		"--hostname", host, "--auth", "trust", "--no-ssl"); err != nil {
		return err
	}
	if err := f.waitFor(ctx, timeout, "the monitor accepts nodes", f.monitorReady); err != nil {
		return err
	}
	if err := f.tuneMonitor(ctx); err != nil {
		return err
	}
	primary, err := f.createNode(ctx, "node1", ports[1])
	if err != nil {
		return err
	}
	if err := f.waitFor(ctx, timeout, "node1 runs alone", f.inState(primary, "single")); err != nil {
		return err
	}
	if err := f.exec(ctx, f.nodeURL(primary, "postgres"), nodeSettings...); err != nil {
		return fmt.Errorf("pgha: tune node1: %w", err)
	}
	standby, err := f.createNode(ctx, "node2", ports[2])
	if err != nil {
		return err
	}
	return f.WaitSecondary(ctx, standby, timeout)
}

// monitorSettings make the monitor decide within a few seconds that a
// node is gone and promote the other: a health check every half second
// (a killed node refuses it at once), a node unhealthy after three seconds
// without a report from its keeper and two failed checks in a row, and a
// primary that cannot be reached given a second to demote itself.
// Tighter bounds (a second) made a loaded machine's slow keeper look dead:
// the monitor failed over on its own, before the test's kill.
// startup_grace_period lets the health checks count soon after the
// monitor starts.
var monitorSettings = map[string]string{
	"pgautofailover.health_check_period":               "500",
	"pgautofailover.health_check_timeout":              "2000",
	"pgautofailover.health_check_max_retries":          "2",
	"pgautofailover.health_check_retry_delay":          "200",
	"pgautofailover.node_considered_unhealthy_timeout": "3000",
	"pgautofailover.primary_demote_timeout":            "1000",
	"pgautofailover.startup_grace_period":              "1000",
}

// nodeSettings are run on the first node before the standby copies its
// data directory, and with it these settings: no fsync, which a process
// kill does not need (the page cache survives it), and checkpoints at full
// speed, since the copy starts with one and would wait minutes for a
// checkpoint spread over checkpoint_timeout.
var nodeSettings = []string{
	`ALTER SYSTEM SET fsync = off`,
	`ALTER SYSTEM SET checkpoint_completion_target = 0`,
	`SELECT pg_reload_conf()`,
}

// tuneMonitor applies monitorSettings.
func (f *Formation) tuneMonitor(ctx context.Context) error {
	var statements []string
	for name, value := range monitorSettings {
		statements = append(statements, "ALTER SYSTEM SET "+name+" = "+value)
	}
	statements = append(statements, `SELECT pg_reload_conf()`)
	if err := f.exec(ctx, f.nodeURL(f.monitor, "pg_auto_failover"), statements...); err != nil {
		return fmt.Errorf("pgha: tune the monitor: %w", err)
	}
	return nil
}

// Dir is the node's data directory.
func (n *Node) Dir() string { return n.pgdata }

func (f *Formation) newNode(name string, port int) *Node {
	return &Node{Name: name, Port: port, pgdata: filepath.Join(f.dir, name), log: filepath.Join(f.dir, name+".log")}
}

// createNode registers a data node at the monitor and starts its keeper,
// which initialises it: the first node as the primary, the next as its
// standby, copied from it.
func (f *Formation) createNode(ctx context.Context, name string, port int) (*Node, error) {
	n := f.newNode(name, port)
	f.mu.Lock()
	f.nodes = append(f.nodes, n)
	f.mu.Unlock()
	err := f.startKeeper(n, "create", "postgres", "--run", "--pgdata", n.pgdata,
		"--pgport", strconv.Itoa(port), "--pgctl", filepath.Join(f.bin, "pg_ctl"), "--name", name,
		"--hostname", host, "--listen", host, "--dbname", f.database, "--auth", "trust", "--no-ssl",
		"--monitor", f.nodeURL(f.monitor, "pg_auto_failover"))
	return n, err
}

// Nodes are the formation's data nodes.
func (f *Formation) Nodes() []*Node { return f.nodes }

// Dir is the formation's private directory: the nodes' data directories,
// their keepers' logs and pg_autoctl's files.
func (f *Formation) Dir() string { return f.dir }

// URL is a connection string for the application's database as the
// "postgres" superuser, naming every data node, that connects to the one
// that takes writes (target_session_attrs=read-write); a connection
// attempt gives up after 5 seconds.
func (f *Formation) URL() string {
	hosts := make([]string, len(f.nodes))
	for i, n := range f.nodes {
		hosts[i] = net.JoinHostPort(host, strconv.Itoa(n.Port))
	}
	return (&url.URL{Scheme: "postgres", User: url.User("postgres"), Host: strings.Join(hosts, ","),
		Path: "/" + f.database, RawQuery: "sslmode=disable&connect_timeout=5&target_session_attrs=read-write"}).String()
}

// NodeURL is a connection string for the application's database on node n
// alone, whatever its role.
func (f *Formation) NodeURL(n *Node) string { return f.nodeURL(n, f.database) }

func (f *Formation) nodeURL(n *Node, database string) string {
	return (&url.URL{Scheme: "postgres", User: url.User("postgres"),
		Host: net.JoinHostPort(host, strconv.Itoa(n.Port)), Path: "/" + database,
		RawQuery: "sslmode=disable&connect_timeout=5"}).String()
}

// exec runs statements, one at a time, on a new connection to url.
func (f *Formation) exec(ctx context.Context, url string, statements ...string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, s := range statements {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// Stop shuts every node down (its keeper stops its PostgreSQL, which is
// killed if it has not stopped within a few seconds) and removes the
// formation's directory. It is safe to call more than once.
func (f *Formation) Stop() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return f.stopErr
	}
	f.stopped = true
	var errs []error
	for _, n := range append(append([]*Node{}, f.nodes...), f.monitor) {
		if n != nil && n.keeper != nil {
			errs = append(errs, n.stop())
		}
	}
	errs = append(errs, os.RemoveAll(f.dir))
	f.stopErr = errors.Join(errs...)
	f.logger.Info("pg_auto_failover formation stopped", slog.String("dir", f.dir))
	return f.stopErr
}
