// Package hooks holds what recovery and phase hand to package seam at
// init. It imports nothing of onceflow's, so both can import it; use
// package seam, which gives the values their types.
package hooks

// Store returns the engine's view of a *recovery.Store; recovery sets it.
var Store func(store any) any

// Step returns the engine's view of a phase.Step; phase sets it.
var Step func(step any) any
