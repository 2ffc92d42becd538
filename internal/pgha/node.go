package pgha

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/onceflow/onceflow/internal/child"
)

// stopGrace is how long a stopping keeper gets to stop its PostgreSQL
// before the node is killed; goneTimeout bounds the wait for a killed
// node's processes to be gone.
const (
	stopGrace   = 10 * time.Second
	goneTimeout = 10 * time.Second
)

// ErrNodeRunning reports a Rejoin of a node whose keeper runs, and
// ErrNodeDown a Kill of a node that is down.
var (
	ErrNodeRunning = errors.New("pgha: the node is running")
	ErrNodeDown    = errors.New("pgha: the node is down")
)

// startKeeper runs pg_autoctl with args for node n, as the server's user,
// in a process group of its own, its output appended to the node's log.
// If this process dies first, the keeper gets SIGQUIT and stops its
// PostgreSQL. The caller holds f.mu or owns n alone.
func (f *Formation) startKeeper(n *Node, args ...string) error {
	log, err := os.OpenFile(n.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgha: open the log of %s: %w", n.Name, err)
	}
	defer log.Close()
	cmd := exec.Command(f.autoctl, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: f.cred, Setpgid: true}
	cmd.Env = f.env
	cmd.Dir = f.dir
	cmd.Stdout, cmd.Stderr = log, log
	p, err := child.Start(cmd, syscall.SIGQUIT)
	if err != nil {
		return fmt.Errorf("pgha: %s: %w", n.Name, err)
	}
	n.keeper = p
	return nil
}

// Kill ends node n as losing its machine would: its keeper and every one
// of its PostgreSQL processes get SIGKILL, so that nothing stops cleanly
// or restarts the server in place. It returns once they are gone.
func (f *Formation) Kill(n *Node) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return ErrStopped
	}
	if n.keeper == nil {
		return fmt.Errorf("%w: %s", ErrNodeDown, n.Name)
	}
	return n.kill()
}

// KillPrimary kills the node the monitor has as the primary, and returns
// it. While the monitor moves the primary through a change of settings
// (a node leaving the write quorum passes through apply_settings), no
// node is settled as the primary: KillPrimary waits for one, for at most
// timeout.
func (f *Formation) KillPrimary(ctx context.Context, timeout time.Duration) (*Node, error) {
	var p *Node
	err := f.waitFor(ctx, timeout, "a node is the primary", func(ctx context.Context) (bool, error) {
		var err error
		p, err = f.Primary(ctx)
		return err == nil, err
	})
	if err != nil {
		return nil, err
	}
	return p, f.Kill(p)
}

// Rejoin starts node n's keeper again after Kill. It returns at once; the
// keeper rewinds the node and makes it a standby of the new primary
// (WaitSecondary tells when).
func (f *Formation) Rejoin(n *Node) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return ErrStopped
	}
	if n.keeper != nil {
		return fmt.Errorf("%w: %s", ErrNodeRunning, n.Name)
	}
	return f.startKeeper(n, "run", "--pgdata", n.pgdata)
}

// kill ends the node at once. The postmaster is stopped first, so that it
// starts no process while its children are killed; its children have
// sessions of their own, outside the keeper's process group.
func (n *Node) kill() error {
	group := n.keeper.Pid()
	postmaster, ok := n.postmaster(group)
	var procs []int
	if ok {
		_ = syscall.Kill(postmaster, syscall.SIGSTOP)
		procs = append(childrenOf(postmaster), postmaster)
		for _, pid := range procs {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	_ = syscall.Kill(-group, syscall.SIGKILL)
	<-n.keeper.Exited()
	n.keeper = nil
	return waitGone(n.Name, procs)
}

// stop asks the keeper to stop its node (SIGQUIT: PostgreSQL's fast
// shutdown) and kills the node if it has not stopped within stopGrace.
func (n *Node) stop() error {
	n.keeper.Stop(syscall.SIGQUIT, stopGrace)
	if _, ok := n.postmaster(n.keeper.Pid()); ok {
		return n.kill() // the keeper died and left its server running
	}
	_ = syscall.Kill(-n.keeper.Pid(), syscall.SIGKILL) // any helper the keeper left
	n.keeper = nil
	return nil
}

// postmaster returns the PID of the node's running postmaster: the one in
// its data directory's postmaster.pid, if that process is in the keeper's
// process group (the file may name a server long gone, and its PID
// another process since).
func (n *Node) postmaster(group int) (int, bool) {
	pid, ok := child.ReadPID(filepath.Join(n.pgdata, "postmaster.pid"))
	if !ok {
		return 0, false
	}
	st, ok := readStat(pid)
	return pid, ok && st.pgrp == group
}

// waitGone waits until none of procs runs, for at most goneTimeout: a new
// postmaster on the same data directory refuses to start while the old
// one, or a process attached to its shared memory, lives.
func waitGone(name string, procs []int) error {
	deadline := time.Now().Add(goneTimeout)
	for _, pid := range procs {
		for !gone(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("pgha: process %d of %s still runs %s after SIGKILL", pid, name, goneTimeout)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// procStat is what pgha reads of /proc/PID/stat.
type procStat struct {
	state      byte
	ppid, pgrp int
}

// readStat reads process pid's state, parent and process group.
func readStat(pid int) (procStat, bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(raw), ')')
	if i < 0 {
		return procStat{}, false
	}
	fields := strings.Fields(string(raw[i+1:]))
	if len(fields) < 3 {
		return procStat{}, false
	}
	ppid, err1 := strconv.Atoi(fields[1])
	pgrp, err2 := strconv.Atoi(fields[2])
	if err1 != nil || err2 != nil || len(fields[0]) != 1 {
		return procStat{}, false
	}
	return procStat{state: fields[0][0], ppid: ppid, pgrp: pgrp}, true
}

// gone reports whether process pid has exited: no such process, or a
// zombie waiting to be reaped.
func gone(pid int) bool {
	st, ok := readStat(pid)
	return !ok || st.state == 'Z' || st.state == 'X'
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var children []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(p); ok && st.ppid == pid {
			children = append(children, p)
		}
	}
	return children
}
