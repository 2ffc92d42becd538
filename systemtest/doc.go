// Package systemtest runs onceflow as a user deploys it and breaks what it
// stands on: it builds examples/checkout, runs `checkout serve` and the
// fake payment provider as processes against a real PostgreSQL, and kills
// servers with SIGKILL under load, pauses an owner past its lease, cuts
// the database connections and restarts PostgreSQL, then checks that every
// checkout completed once with one charge and every retry got the first
// answer byte for byte.
//
// The package has tests only. They take minutes; the example's own
// contract tests stay beside it in examples/checkout.
package systemtest
