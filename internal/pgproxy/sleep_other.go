//go:build !linux

package pgproxy

import "time"

// sleepUntil sleeps until t, as precisely as the runtime's timers allow.
func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }
