// Package serveproc runs `checkout serve` (examples/checkout) as a child
// process for the example's own tests and demo and for systemtest: it
// starts it, waits until it listens, and reads what it prints.
package serveproc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/onceflow/onceflow/internal/child"
)

// Process is `checkout serve` running as a child process.
type Process struct {
	Proc   *child.Process
	URL    string
	APIKey string          // the key serve made, when it was given none
	DBURL  string          // the throwaway database serve started, when it was given none
	done   <-chan struct{} // closed when the process has exited
	mu     sync.Mutex
	stderr bytes.Buffer
}

// Start starts exe serve with args and waits until it listens. The
// child gets SIGKILL if this process dies first.
func Start(ctx context.Context, exe string, args ...string) (*Process, error) {
	cmd := exec.Command(exe, append([]string{"serve", "--addr", "127.0.0.1:0"}, args...)...)
	p := &Process{}
	stdout, stdoutW := io.Pipe()
	cmd.Stdout = stdoutW
	cmd.Stderr = &lockedWriter{mu: &p.mu, w: &p.stderr}
	var err error
	if p.Proc, err = child.Start(cmd, syscall.SIGKILL); err != nil {
		return nil, err
	}
	p.done = p.Proc.Exited()
	go func() {
		<-p.done // every byte of stdout has been copied into the pipe
		_ = stdoutW.Close()
	}()
	type started struct{ url, apiKey, dbURL string }
	urls := make(chan started, 1)
	go func() {
		lines := bufio.NewScanner(stdout)
		var apiKey, dbURL string
		for lines.Scan() {
			if key, found := strings.CutPrefix(lines.Text(), "export CHECKOUT_API_KEY="); found {
				apiKey = key
			}
			if url, found := strings.CutPrefix(lines.Text(), "export ONCEFLOW_DATABASE_URL="); found {
				dbURL = url
			}
			if url, found := strings.CutPrefix(lines.Text(), "listening on "); found {
				urls <- started{url, apiKey, dbURL}
			}
		}
		_, _ = io.Copy(io.Discard, stdout) // a line too long for the scanner
	}()
	select {
	case s := <-urls:
		p.URL, p.APIKey, p.DBURL = s.url, s.apiKey, s.dbURL
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("checkout serve exited before listening: %v: %s", p.Proc.Err(), p.Stderr())
	case <-time.After(2 * time.Minute):
		p.Kill()
		return nil, errors.New("checkout serve did not start listening within two minutes")
	case <-ctx.Done():
		p.Kill()
		return nil, ctx.Err()
	}
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait waits for the process to exit and returns its exit code.
func (p *Process) Wait() int {
	<-p.done
	return p.Proc.ExitCode()
}

// Stop asks the process to stop (SIGTERM) and waits for it.
func (p *Process) Stop() int {
	_ = p.Proc.Signal(syscall.SIGTERM)
	return p.Wait()
}

// Kill ends the process at once; it does nothing if it has ended.
func (p *Process) Kill() { p.Proc.Kill() }

// Stderr is what the process logged so far.
func (p *Process) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
