package main

import "github.com/onceflow/onceflow/internal/serveproc"

// serveProcess is `checkout serve` running as a child process.
type serveProcess = serveproc.Process

// startServe starts exe serve with args and waits until it listens.
var startServe = serveproc.Start
