// Command onceflow operates onceflow's tables: migrations, the sweeper for
// deployments whose workflows live in another binary, and inspection of
// keys and outbox messages.
//
//	onceflow migrate up|down|status
//	onceflow sweeper [--prune-every SPEC] [--retention D] [--metrics-addr ADDR]
//	onceflow keys list|show|release|fail|resume
//	onceflow outbox list|retry|dead
//	onceflow workflows export|diff
//
// Every command takes --database-url (or ONCEFLOW_DATABASE_URL) and --schema.
// Errors are one line on standard error and a non-zero exit code: 1 when
// the command failed, 2 when it was called wrongly, and 3 when workflows
// diff finds in-flight records that the current definitions would park.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/onceflow/onceflow/internal/dbschema"
	"github.com/onceflow/onceflow/recovery"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the command line args and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	// A table or function of onceflow's missing is one sentence naming the
	// command that fixes it, whichever command met it.
	schema, _ := root.PersistentFlags().GetString("schema")
	err = recovery.NotMigrated(cmp.Or(schema, dbschema.Default), err)
	fmt.Fprintf(stderr, "onceflow: %s\n", printable(oneLine(err.Error())))
	var usage usageError
	switch {
	case errors.As(err, &usage) || strings.HasPrefix(err.Error(), "unknown command") ||
		strings.HasPrefix(err.Error(), "required flag"):
		return 2
	case errors.Is(err, errWouldPark):
		return wouldParkExitCode
	}
	return 1
}

// oneLine folds a multi-line error message (pgx lists every address it
// tried) onto one line.
func oneLine(msg string) string {
	return strings.Join(strings.FieldsFunc(msg, func(r rune) bool { return r == '\n' || r == '\t' }), "; ")
}

// usageError is a command called wrongly: bad flags or arguments.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }
