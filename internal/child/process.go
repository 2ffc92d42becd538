package child

import (
	"fmt"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// Process is a running child process.
type Process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // cmd.Wait's, once exited is closed
}

// Start starts cmd with deathSignal as its parent-death signal (keeping any
// other SysProcAttr settings, such as a Credential) and waits for it in the
// background. cmd must not have been started, and its caller must not call
// Wait: Exited and Err tell when and how it ended. If cmd writes to a pipe
// from StdoutPipe or StderrPipe, read it through an io.Pipe set as
// cmd.Stdout instead, which Wait does not close early.
func Start(cmd *exec.Cmd, deathSignal syscall.Signal) (*Process, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = deathSignal
	p := &Process{cmd: cmd, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// The parent-death signal follows this thread: keep it until the
		// child has exited (see the package documentation). The goroutine
		// exits locked, and its thread with it.
		runtime.LockOSThread()
		err := cmd.Start()
		started <- err
		if err != nil {
			return
		}
		p.err = cmd.Wait()
		close(p.exited)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	return p, nil
}

// Pid is the child's process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the child has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Err is how the child ended (exec.Cmd.Wait's error): nil for exit code
// 0. Call it after Exited is closed.
func (p *Process) Err() error { return p.err }

// ExitCode is the child's exit code, or -1 if a signal ended it. Call it
// after Exited is closed.
func (p *Process) ExitCode() int { return p.cmd.ProcessState.ExitCode() }

// Signal sends sig to the child.
func (p *Process) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop sends sig and waits for the child to exit; if it has not after
// grace, it kills the child and waits for that.
func (p *Process) Stop(sig syscall.Signal, grace time.Duration) {
	_ = p.Signal(sig)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.exited:
	case <-timer.C:
		p.Kill()
	}
}

// Kill kills the child (SIGKILL) and waits for it to exit.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}
