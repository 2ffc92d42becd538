package bench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// errNoServerCPU reports a server whose processes this one cannot see: one
// it did not start, or a system without /proc.
var errNoServerCPU = errors.New("server CPU is measured only on the throwaway server, on Linux")

// serverCPU returns the CPU time the throwaway server's processes have
// used so far: the postmaster and every process it started, by the
// scheduler's nanosecond count (/proc/PID/schedstat). A process that ended
// takes its time with it: between two readings, count on long-lived
// connections.
func (s *server) serverCPU() (time.Duration, error) {
	if s.cluster == nil {
		return 0, errNoServerCPU
	}
	pidFile, err := os.ReadFile(filepath.Join(s.cluster.Dir(), "data", "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errNoServerCPU, err)
	}
	first, _, _ := strings.Cut(string(pidFile), "\n")
	postmaster := strings.TrimSpace(first)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errNoServerCPU, err)
	}
	var total time.Duration
	for _, e := range entries {
		pid := e.Name()
		if _, err := strconv.Atoi(pid); err != nil {
			continue
		}
		if pid != postmaster && parentOf(pid) != postmaster {
			continue
		}
		total += onCPU(pid)
	}
	return total, nil
}

// parentOf returns the parent's pid of process pid, "" when it is gone.
func parentOf(pid string) string {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return ""
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return ""
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 2 {
		return ""
	}
	return fields[1]
}

// onCPU returns how long process pid has run, 0 when it is gone.
func onCPU(pid string) time.Duration {
	b, err := os.ReadFile("/proc/" + pid + "/schedstat")
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), " ")
	ns, _ := strconv.ParseInt(first, 10, 64)
	return time.Duration(ns)
}

// clientCPU returns the CPU time this process has used so far, user and
// system.
func clientCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
