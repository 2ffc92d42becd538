package pgbouncer

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/child"
)

// QueryExecMode is the pgx default_query_exec_mode that URL sets.
//
// pgx's default, cache_statement, prepares named statements on the server
// connection and reuses them in later transactions, which PgBouncer 1.18
// may run on another server connection: "prepared statement does not
// exist". cache_describe uses only the unnamed statement, within one
// round trip, and keeps the statements' descriptions (parameter and result
// types) on the client, which are the same on every server connection of
// a database; it encodes arguments by their real parameter types, as the
// default does. (exec would work too, but sends each argument as text
// typed by its Go type, which turns a []byte meant for a json parameter
// into bytea's hex text.)
const QueryExecMode = "cache_describe"

// StartTimeoutDefault bounds how long Start waits for PgBouncer to accept
// connections.
const StartTimeoutDefault = 30 * time.Second

// PoolSizeDefault is the number of server connections per database when
// Options.PoolSize is 0: PgBouncer's own default.
const PoolSizeDefault = 20

// maxClients is PgBouncer's max_client_conn: tests open many pools.
const maxClients = 2000

// queryWaitTimeout is PgBouncer's query_wait_timeout: how long a client
// waits for a server connection before PgBouncer fails its query.
const queryWaitTimeout = 15 * time.Second

// Options configures a throwaway PgBouncer.
type Options struct {
	// Server is the PostgreSQL server to pool, as a connection string (URL
	// or keyword/value). Its host, port, user and password are used; the
	// bouncer serves every database on that server as the same user, with
	// the same password. Required.
	Server string

	// PoolSize is how many server connections each database gets; clients
	// beyond it wait until a transaction ends. 0 means PoolSizeDefault.
	PoolSize int

	// StartTimeout bounds the wait for PgBouncer to accept connections.
	// 0 means StartTimeoutDefault.
	StartTimeout time.Duration

	// Logger receives one line when the bouncer starts and one when it
	// stops. nil discards them.
	Logger *slog.Logger
}

// Bouncer is a running throwaway PgBouncer.
type Bouncer struct {
	dir      string
	user     string
	password string
	port     int
	proc     *child.Process
	logger   *slog.Logger

	stopOnce sync.Once
	stopErr  error
}

// target is the server PgBouncer connects to, and as whom.
type target struct {
	host, user, password string
	port                 uint16
}

// Start starts PgBouncer in transaction pooling mode in front of
// opts.Server, on a free loopback port, from a new temporary directory.
// Call Stop to shut it down and remove the directory.
//
// Clients log in with SCRAM-SHA-256 as the server's user with the server's
// password (a random one when the server needs none); PgBouncer logs in to
// the server with the same credentials.
func Start(ctx context.Context, opts Options) (*Bouncer, error) {
	bin, err := FindBinary()
	if err != nil {
		return nil, err
	}
	srv, err := parseServer(opts.Server)
	if err != nil {
		return nil, err
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	removeStale(logger)
	dir, err := newDir(cred)
	if err != nil {
		return nil, err
	}
	// A free port can be taken between choosing and binding it; try again.
	for attempt := 0; ; attempt++ {
		b, err := start(ctx, bin, dir, srv, cred, opts, logger)
		if err == nil {
			logger.Info("throwaway PgBouncer started", slog.String("dir", dir), slog.Int("port", b.port))
			return b, nil
		}
		if attempt < 3 && errors.Is(err, errPortTaken) {
			continue
		}
		_ = os.RemoveAll(dir)
		return nil, err
	}
}

func parseServer(connString string) (target, error) {
	if connString == "" {
		return target{}, errors.New("pgbouncer: Options.Server is required")
	}
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		return target{}, fmt.Errorf("pgbouncer: parse the server's connection string: %w", err)
	}
	t := target{host: cfg.Host, port: cfg.Port, user: cfg.User, password: cfg.Password}
	if t.password == "" {
		t.password = child.RandomHex(24) // clients still need one to reach the bouncer
	}
	for _, v := range []string{t.host, t.user} {
		if v == "" || strings.ContainsAny(v, " \t\r\n'\"\\;") {
			return target{}, fmt.Errorf("pgbouncer: cannot write %q into a configuration file", v)
		}
	}
	return t, nil
}

// credential returns the credential to run PgBouncer with: nil for a normal
// user; when running as root, which PgBouncer refuses, the "postgres"
// user's, else "nobody"'s.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	var lookupErr error
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			lookupErr = errors.Join(lookupErr, err)
			continue
		}
		uid, uidErr := strconv.ParseUint(u.Uid, 10, 32)
		gid, gidErr := strconv.ParseUint(u.Gid, 10, 32)
		if uidErr != nil || gidErr != nil {
			return nil, fmt.Errorf("pgbouncer: ids of user %s: %w", name, errors.Join(uidErr, gidErr))
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("pgbouncer: running as root, PgBouncer must run as postgres or nobody, and neither exists: %w", lookupErr)
}

var errPortTaken = errors.New("port taken")

func start(ctx context.Context, bin, dir string, srv target, cred *syscall.Credential, opts Options, logger *slog.Logger) (*Bouncer, error) {
	port, err := child.FreePort()
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	b := &Bouncer{dir: dir, user: srv.user, password: srv.password, port: port, logger: logger}
	configPath, err := b.writeFiles(srv, cmp.Or(opts.PoolSize, PoolSizeDefault), cred)
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "pgbouncer.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: create log: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin, configPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = dir
	// If this process dies without Stop, PgBouncer shuts down at once.
	if b.proc, err = child.Start(cmd, syscall.SIGTERM); err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	_ = os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(b.proc.Pid())), 0o644)

	if err := child.WaitConnect(ctx, b.proc, b.AdminURL(), cmp.Or(opts.StartTimeout, StartTimeoutDefault)); err != nil {
		b.proc.Kill()
		log, _ := os.ReadFile(logPath)
		if bytes.Contains(log, []byte("Address already in use")) {
			return nil, errPortTaken
		}
		return nil, fmt.Errorf("pgbouncer %w; pgbouncer log: %s", err, child.LastLines(log, 10))
	}
	return b, nil
}

// writeFiles writes the configuration and the password file into the
// bouncer's directory, readable by the user PgBouncer runs as, and returns
// the configuration's path.
func (b *Bouncer) writeFiles(srv target, poolSize int, cred *syscall.Credential) (string, error) {
	authFile := filepath.Join(b.dir, "userlist.txt")
	configPath := filepath.Join(b.dir, "pgbouncer.ini")
	config := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
pool_mode = transaction
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = scram-sha-256
auth_file = %s
admin_users = %s
default_pool_size = %d
max_client_conn = %d
server_round_robin = 1
server_login_retry = 1
query_wait_timeout = %d
`, srv.host, srv.port, b.port, authFile, srv.user, poolSize, maxClients, int(queryWaitTimeout/time.Second))
	// query_wait_timeout bounds how long a client waits for a server
	// connection: with the database down, PgBouncer's default (two
	// minutes) holds every request that long before it fails.
	// server_round_robin hands a client's next transaction the server
	// connection idle longest, so that state a transaction left behind on
	// its server connection is rarely there for the next one.
	files := map[string]string{
		authFile:   fmt.Sprintf("%s %s\n", quote(srv.user), quote(srv.password)),
		configPath: config,
	}
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			return "", fmt.Errorf("pgbouncer: write %s: %w", filepath.Base(path), err)
		}
		if cred != nil {
			if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
				return "", fmt.Errorf("pgbouncer: hand %s to its user: %w", filepath.Base(path), err)
			}
		}
	}
	return configPath, nil
}

// quote writes s as a string of PgBouncer's auth_file.
func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// URL is a connection string for database through the bouncer, with the
// pgx setting transaction pooling needs (QueryExecMode).
func (b *Bouncer) URL(database string) string {
	return b.url(database, "default_query_exec_mode="+QueryExecMode)
}

// AdminURL is a connection string for PgBouncer's admin console (the
// "pgbouncer" database: SHOW POOLS, SHOW SERVERS...), which speaks only the
// simple query protocol.
func (b *Bouncer) AdminURL() string {
	return b.url("pgbouncer", "default_query_exec_mode=simple_protocol")
}

func (b *Bouncer) url(database, query string) string {
	return (&url.URL{
		Scheme: "postgres", User: url.UserPassword(b.user, b.password),
		Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)), Path: "/" + database,
		RawQuery: "sslmode=disable&" + query,
	}).String()
}

// Dir is the bouncer's private directory: its configuration, password file
// and log.
func (b *Bouncer) Dir() string { return b.dir }

// Stop shuts PgBouncer down (immediate shutdown, then a kill after 10s) and
// removes its directory. It is safe to call more than once.
func (b *Bouncer) Stop() error {
	b.stopOnce.Do(func() {
		b.proc.Stop(syscall.SIGTERM, 10*time.Second)
		b.stopErr = os.RemoveAll(b.dir)
		b.logger.Info("throwaway PgBouncer stopped", slog.String("dir", b.dir))
	})
	return b.stopErr
}
