package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Bounds of the throwaway server's start and stop.
const (
	startTimeout = 60 * time.Second
	stopGrace    = 30 * time.Second
)

// serverSettings are the throwaway server's: PostgreSQL's defaults, which
// commit durably (fsync, full-page writes and synchronous commit on, said
// here so that nothing can turn them off), on loopback TCP, with room for
// every side's pool.
var serverSettings = []string{
	"fsync=on", "full_page_writes=on", "synchronous_commit=on",
	"listen_addresses=127.0.0.1", "max_connections=300", "log_min_messages=warning",
}

// startPostgres initialises a cluster in a new temporary directory and
// starts its server on a free loopback port. The superuser has a random
// password. stop shuts the server down and removes the directory; if this
// process dies first, the server gets SIGQUIT.
func startPostgres(ctx context.Context) (dsn string, stop func(), err error) {
	bin, err := findBinaries()
	if err != nil {
		return "", nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "onceflow-compare-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	password := hex.EncodeToString(b)
	if err := initdb(ctx, bin, dir, password, cred); err != nil {
		cleanup()
		return "", nil, err
	}
	port, err := freePort()
	if err != nil {
		cleanup()
		return "", nil, err
	}
	dsn = (&url.URL{Scheme: "postgres", User: url.UserPassword("postgres", password),
		Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Path: "/postgres", RawQuery: "sslmode=disable"}).String()
	args := []string{"-D", filepath.Join(dir, "data"), "-p", strconv.Itoa(port), "-k", dir}
	for _, s := range serverSettings {
		args = append(args, "-c", s)
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	logFile, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		cleanup()
		return "", nil, err
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT}
	exited, err := startLocked(cmd)
	if err != nil {
		cleanup()
		return "", nil, err
	}
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-exited:
		case <-time.After(stopGrace):
			_ = cmd.Process.Kill()
			<-exited
		}
		cleanup()
	}
	if err := waitConnect(ctx, dsn, exited); err != nil {
		stop()
		return "", nil, err
	}
	return dsn, stop, nil
}

// startLocked starts cmd from a thread that stays locked until cmd exits:
// the parent-death signal follows the thread that started the child, and
// Go may otherwise end that thread while the child runs.
func startLocked(cmd *exec.Cmd) (exited <-chan struct{}, err error) {
	done, started := make(chan struct{}), make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("start postgres: %w", err)
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(done)
	}()
	return done, <-started
}

// waitConnect waits until dsn accepts connections, the server exits, or
// startTimeout passes.
func waitConnect(ctx context.Context, dsn string, exited <-chan struct{}) error {
	deadline := time.Now().Add(startTimeout)
	for {
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-exited:
			return errors.New("postgres exited while starting; see its server.log")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres did not accept connections within %s: %w", startTimeout, err)
		}
	}
}

// initdb creates the cluster: trust on the Unix socket, in a directory
// only its owner reaches, and the password on TCP.
func initdb(ctx context.Context, bin, dir, password string, cred *syscall.Credential) error {
	pwfile := filepath.Join(dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(password+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(pwfile)
	if cred != nil {
		for _, p := range []string{dir, pwfile} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return fmt.Errorf("hand the cluster directory to postgres: %w", err)
			}
		}
	}
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"), "-U", "postgres",
		"--pwfile", pwfile, "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-locale")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	return nil
}

// findBinaries returns the directory of initdb and postgres: on PATH, or
// the newest under /usr/lib/postgresql (Debian and Ubuntu).
func findBinaries() (string, error) {
	var dirs []string
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dirs = append(dirs, filepath.Dir(p))
	}
	versions, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(versions, func(a, b string) int { return majorVersion(b) - majorVersion(a) })
	for _, d := range append(dirs, versions...) {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries (initdb, postgres) on PATH or under /usr/lib/postgresql: " +
		"install them (Debian/Ubuntu: apt-get install postgresql) or pass --database-url")
}

func majorVersion(binDir string) int {
	v, _ := strconv.Atoi(strings.Split(filepath.Base(filepath.Dir(binDir)), ".")[0])
	return v
}

// serverCredential is nil for a normal user; as root, the server runs as
// the postgres user, since PostgreSQL refuses to run as root.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, the server must run as the postgres user: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
