package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// serveProcess is `checkout serve` running as a child process.
type serveProcess struct {
	cmd    *exec.Cmd
	URL    string
	done   chan struct{}
	err    error
	mu     sync.Mutex
	stderr bytes.Buffer
}

// startServe starts exe serve with args and waits until it listens. The
// child gets SIGKILL if this process dies first.
func startServe(ctx context.Context, exe string, args ...string) (*serveProcess, error) {
	p := &serveProcess{cmd: exec.Command(exe, append([]string{"serve", "--addr", "127.0.0.1:0"}, args...)...), done: make(chan struct{})}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.cmd.Stderr = &lockedWriter{mu: &p.mu, w: &p.stderr}
	started := make(chan error, 1)
	read := make(chan struct{})
	go func() {
		// Linux sends the parent-death signal when the thread that started
		// the child exits, not the process, and the Go runtime ends a
		// thread whenever a goroutine locked to it exits (as the throwaway
		// PostgreSQL's does when it stops). So the child is started from a
		// goroutine that keeps its thread until the child has exited; else
		// another part of this process could take the child down with it.
		runtime.LockOSThread()
		err := p.cmd.Start()
		started <- err
		if err != nil {
			return
		}
		<-read // Wait closes the pipe: read it to the end first
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	urls := make(chan string, 1)
	go func() {
		defer close(read)
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if url, found := strings.CutPrefix(lines.Text(), "listening on "); found {
				urls <- url
			}
		}
	}()
	select {
	case p.URL = <-urls:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("checkout serve exited before listening: %v: %s", p.err, p.Stderr())
	case <-time.After(2 * time.Minute):
		p.Kill()
		return nil, errors.New("checkout serve did not start listening within two minutes")
	case <-ctx.Done():
		p.Kill()
		return nil, ctx.Err()
	}
}

// Wait waits for the process to exit and returns its exit code.
func (p *serveProcess) Wait() int {
	<-p.done
	return p.cmd.ProcessState.ExitCode()
}

// Stop asks the process to stop (SIGTERM) and waits for it.
func (p *serveProcess) Stop() int {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	return p.Wait()
}

// Kill ends the process at once; it does nothing if it has ended.
func (p *serveProcess) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Stderr is what the process logged so far.
func (p *serveProcess) Stderr() string {
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
