package pgproxy

import (
	"syscall"
	"time"
)

// sleepUntil sleeps until t. It sleeps in the kernel: the Go runtime's
// timers wake sub-millisecond sleeps a millisecond late on Linux, which
// would make a network delay of a quarter millisecond four times longer.
// Only the calling goroutine's thread sleeps; the runtime runs the other
// goroutines on other threads meanwhile.
func sleepUntil(t time.Time) {
	for d := time.Until(t); d > 0; d = time.Until(t) {
		ts := syscall.NsecToTimespec(int64(d))
		_ = syscall.Nanosleep(&ts, nil) // an interrupted sleep goes round again
	}
}
