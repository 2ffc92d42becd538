package child_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/child"
)

// TestChildOutlivesTheThreadThatStartedIt: a child started from a
// goroutine whose OS thread then ends keeps running, although its
// parent-death signal follows the thread that started it.
func TestChildOutlivesTheThreadThatStartedIt(t *testing.T) {
	type started struct {
		p   *child.Process
		tid int
		err error
	}
	result := make(chan started, 1)
	var start func()
	start = func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if syscall.Gettid() == os.Getpid() {
			// The main thread is never ended, only parked: try another.
			go start()
			return
		}
		p, err := child.Start(exec.Command("sleep", "60"), syscall.SIGKILL)
		result <- started{p, syscall.Gettid(), err}
	}
	go start()
	r := <-result
	require.NoError(t, r.err)
	defer r.p.Kill()

	task := fmt.Sprintf("/proc/self/task/%d", r.tid)
	require.Eventually(t, func() bool { _, err := os.Stat(task); return os.IsNotExist(err) },
		time.Minute, 5*time.Millisecond, "the thread that called Start ends")
	// Give a parent-death signal, had it been sent, every chance to land.
	for range 20 {
		runtime.Gosched()
	}
	select {
	case <-r.p.Exited():
		t.Fatalf("the child died with the thread that started it: %v", r.p.Err())
	default:
	}
	require.True(t, child.Alive(r.p.Pid()))

	r.p.Stop(syscall.SIGTERM, 10*time.Second)
	require.Equal(t, -1, r.p.ExitCode(), "ended by the signal")
	require.Error(t, r.p.Err())
	require.False(t, child.Alive(r.p.Pid()))
}

func TestStopKillsAChildThatIgnoresTheSignal(t *testing.T) {
	ready := filepath.Join(t.TempDir(), "ready")
	p, err := child.Start(exec.Command("sh", "-c", `trap "" TERM; touch "$0"; while :; do sleep 0.1; done`, ready), syscall.SIGKILL)
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, err := os.Stat(ready); return err == nil }, time.Minute, 5*time.Millisecond,
		"the child ignores SIGTERM")
	started := time.Now()
	p.Stop(syscall.SIGTERM, 300*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(started), 300*time.Millisecond, "the grace period was given")
	<-p.Exited()
	require.Equal(t, -1, p.ExitCode())
}

func TestStartFails(t *testing.T) {
	_, err := child.Start(exec.Command(filepath.Join(t.TempDir(), "missing")), syscall.SIGKILL)
	require.ErrorContains(t, err, "missing")
}

func TestExitCode(t *testing.T) {
	p, err := child.Start(exec.Command("sh", "-c", "exit 3"), syscall.SIGKILL)
	require.NoError(t, err)
	<-p.Exited()
	require.Equal(t, 3, p.ExitCode())
	p.Kill() // after the exit: does nothing
}

// TestRemoveStale: a directory whose owner and server are gone is removed;
// one whose owner lives, or whose server still runs, is kept.
func TestRemoveStale(t *testing.T) {
	prefix := fmt.Sprintf("onceflow-childtest-%d-", os.Getpid())
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	deadPID := dead.Process.Pid

	mine, err := child.NewDir(prefix, nil)
	require.NoError(t, err)
	defer os.RemoveAll(mine)
	orphan, err := child.NewDir(prefix, nil)
	require.NoError(t, err)
	defer os.RemoveAll(orphan)
	serving, err := child.NewDir(prefix, nil)
	require.NoError(t, err)
	defer os.RemoveAll(serving)
	for _, dir := range []string{orphan, serving} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(deadPID)), 0o644))
	}
	server := func(dir string) (int, bool) {
		if dir == serving {
			return os.Getpid(), true // a live process
		}
		return deadPID, true
	}

	removed := child.RemoveStale(prefix, server)
	require.Equal(t, map[string]int{orphan: deadPID}, removed)
	for dir, kept := range map[string]bool{mine: true, orphan: false, serving: true} {
		_, err := os.Stat(dir)
		require.Equal(t, kept, err == nil, dir)
	}
}

func TestLastLines(t *testing.T) {
	require.Equal(t, "c | d", child.LastLines([]byte("a\nb\nc\nd\n"), 2))
	require.Equal(t, "a", child.LastLines([]byte("a"), 5))
}
