package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// launchParams is everything needed to start a cluster's server: at Start,
// and again at each Resume.
type launchParams struct {
	bin, dir string
	port     int
	cred     *syscall.Credential
	settings map[string]string
	timeout  time.Duration
}

// server is one run of the postgres process.
type server struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process has exited
}

var errPortTaken = errors.New("port taken")

// startServer starts postgres on p's data directory and port and waits
// until url accepts connections. The server log is appended to, so that it
// tells every run of the server.
func startServer(ctx context.Context, p launchParams, url string) (*server, error) {
	args := []string{"-D", filepath.Join(p.dir, "data"), "-p", strconv.Itoa(p.port), "-k", p.dir}
	for name, value := range p.settings {
		args = append(args, "-c", name+"="+value)
	}
	logPath := filepath.Join(p.dir, "server.log")
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open server log: %w", err)
	}
	defer logFile.Close()
	logStart, _ := logFile.Seek(0, io.SeekEnd)
	cmd := exec.Command(filepath.Join(p.bin, "postgres"), args...)
	// If this process dies without Stop, the server shuts down at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Pdeathsig: syscall.SIGQUIT}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = p.dir
	s := &server{cmd: cmd, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// The parent-death signal follows the thread that started the
		// child, so that thread lives exactly as long as the server: a
		// goroutine that exits while locked takes its thread with it.
		runtime.LockOSThread()
		err := cmd.Start()
		started <- err
		if err == nil {
			_ = cmd.Wait()
			close(s.exited)
		}
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}

	if err := s.waitReady(ctx, url, p.timeout); err != nil {
		s.kill()
		log, _ := os.ReadFile(logPath)
		log = log[min(int(logStart), len(log)):] // this run's lines only
		if bytes.Contains(log, []byte("Address already in use")) {
			return nil, errPortTaken
		}
		return nil, fmt.Errorf("%w; server log: %s", err, lastLines(log, 10))
	}
	return s, nil
}

func (s *server) waitReady(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		connCtx, connCancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(connCtx, url)
		connCancel()
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-s.exited:
			return errors.New("postgres exited during start")
		case <-ctx.Done():
			return fmt.Errorf("postgres did not accept connections within %s: %w", timeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// shutdown asks for a fast shutdown (sessions end, their transactions roll
// back, a checkpoint keeps every committed one) and kills the server if it
// has not exited after 10s.
func (s *server) shutdown() {
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		s.kill()
	}
}

func (s *server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}
