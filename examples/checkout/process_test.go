package main

import (
	"fmt"
	"net/http"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestServeOutlivesTheThreadThatStartedIt: a checkout server started from a
// goroutine whose OS thread then ends keeps running. The parent-death
// signal follows the thread that started a child, and the Go runtime ends a
// thread when a goroutine locked to it exits, as the throwaway PostgreSQL's
// does when it stops: a server started on such a thread used to be killed
// by an unrelated test's cluster stopping.
func TestServeOutlivesTheThreadThatStartedIt(t *testing.T) {
	e := newEnv(t)
	type started struct {
		p   *serveProcess
		tid int
		err error
	}
	result := make(chan started, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		p, err := startServe(e.ctx, binary, "--database-url", e.dbURL, "--provider-url", e.provider)
		result <- started{p, syscall.Gettid(), err}
	}()
	r := <-result
	require.NoError(t, r.err)
	t.Cleanup(func() { r.p.Stop() })

	task := fmt.Sprintf("/proc/self/task/%d", r.tid)
	require.Eventually(t, func() bool { _, err := os.Stat(task); return os.IsNotExist(err) },
		time.Minute, 5*time.Millisecond, "the thread that started the server ends")
	res := e.checkout(r.p, "outlives", order)
	require.Equal(t, http.StatusCreated, res.status, res.body)
	select {
	case <-r.p.done:
		t.Fatalf("the server exited with its starting thread: %v", r.p.err)
	default:
	}
}
