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
	"strconv"
	"syscall"
	"time"

	"github.com/onceflow/onceflow/internal/child"
)

// launchParams is everything needed to start a cluster's server: at Start,
// and again at each Resume.
type launchParams struct {
	bin, dir string
	port     int
	cred     *syscall.Credential
	settings map[string]string
	env      []string // added to this process's environment
	timeout  time.Duration
}

var errPortTaken = errors.New("port taken")

// startServer starts postgres on p's data directory and port and waits
// until url accepts connections. If this process dies without stopping it,
// the server gets SIGQUIT (immediate shutdown). The server log is appended
// to, so that it tells every run of the server.
func startServer(ctx context.Context, p launchParams, url string) (*child.Process, error) {
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
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = p.dir
	s, err := child.Start(cmd, syscall.SIGQUIT)
	if err != nil {
		return nil, err
	}
	if err := child.WaitConnect(ctx, s, url, p.timeout); err != nil {
		s.Kill()
		log, _ := os.ReadFile(logPath)
		log = log[min(int(logStart), len(log)):] // this run's lines only
		if bytes.Contains(log, []byte("Address already in use")) {
			return nil, errPortTaken
		}
		return nil, fmt.Errorf("postgres %w; server log: %s", err, child.LastLines(log, 10))
	}
	return s, nil
}

// shutdown asks for a fast shutdown (sessions end, their transactions roll
// back, a checkpoint keeps every committed one) and kills the server if it
// has not exited after 10s.
func shutdown(s *child.Process) { s.Stop(syscall.SIGINT, 10*time.Second) }
