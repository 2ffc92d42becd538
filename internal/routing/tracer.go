package routing

import (
	"context"
	"runtime"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Module is onceflow's module path: statements sent from its packages are
// checked.
const Module = "github.com/onceflow/onceflow/"

// Tracer is a pgx.QueryTracer and pgx.BatchTracer that checks every
// statement onceflow sends through the connection and calls Report with
// each violation that is not a listed maintenance scan.
//
// A statement is onceflow's when the function that sent it, the first on
// the stack outside pgx and outside workflow's phase transaction (which
// passes on a step's own statements), is in a file of onceflow's module
// that is not a _test.go file and not under internal/, which holds the
// test and benchmark tooling. So a test's own SQL (fixtures, counting
// rows) and a step's business SQL are not checked; what onceflow's
// packages send, from the store to the admin console, is. Pools made
// outside this tracer (the processes systemtest and cmd tests start,
// runnable examples) are not covered.
type Tracer struct {
	// Report receives each violation, with the function that sent it.
	Report func(v *Violation, sender string)

	verdicts sync.Map // sql → its unlisted violations, []*Violation
}

// TraceQueryStart checks the statement.
func (t *Tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	t.check(data.SQL)
	return ctx
}

// TraceQueryEnd does nothing.
func (t *Tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart checks each statement of the batch, where it is sent.
func (t *Tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if data.Batch != nil {
		for _, q := range data.Batch.QueuedQueries {
			t.check(q.SQL)
		}
	}
	return ctx
}

// TraceBatchQuery does nothing: the batch was checked when sent.
func (t *Tracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd does nothing.
func (t *Tracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// check reports the statements in sql that violate, when onceflow sent
// them.
func (t *Tracer) check(sql string) {
	found, ok := t.verdicts.Load(sql)
	if !ok {
		found = unlisted(sql)
		t.verdicts.Store(sql, found)
	}
	vs := found.([]*Violation)
	if len(vs) == 0 {
		return
	}
	if sender, ours := sender(); ours {
		for _, v := range vs {
			t.Report(v, sender)
		}
	}
}

// unlisted returns the violations in sql that are not listed maintenance
// scans.
func unlisted(sql string) []*Violation {
	var vs []*Violation
	for _, stmt := range statements(sql) {
		if v := checkStatement(stmt); v != nil && Listed(stmt) == nil {
			vs = append(vs, v)
		}
	}
	return vs
}

// passOn are the functions between pgx and the code that wrote a
// statement, which pass on statements they did not write.
var passOn = []string{
	"github.com/jackc/pgx/",
	Module + "internal/routing.",
	Module + "internal/opentx.",
}

// sender returns the function that sent the statement being traced, and
// whether it is onceflow's (see Tracer).
func sender() (string, bool) {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if !passedOn(f.Function) {
			ours := strings.HasPrefix(f.Function, Module) && !strings.HasPrefix(f.Function, Module+"internal/") &&
				!strings.HasSuffix(f.File, "_test.go")
			return f.Function, ours
		}
		if !more {
			return "", false
		}
	}
}

func passedOn(fn string) bool {
	for _, p := range passOn {
		if strings.HasPrefix(fn, p) {
			return true
		}
	}
	return false
}
