// Package pgtrace counts what a connection pool does to PostgreSQL: the
// statements it sends and the transactions it commits, as the server's
// pg_stat_database.xact_commit counts them. Tests and benchmarks use it to
// hold onceflow to its commit and round-trip budgets.
package pgtrace

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// Counter is a pgx.QueryTracer and pgx.BatchTracer. Install it as
// ConnConfig.Tracer; its counts are safe to read concurrently.
type Counter struct {
	statements atomic.Int64
	batches    atomic.Int64
	commits    atomic.Int64
}

// Counts is a snapshot of a Counter.
type Counts struct {
	// Statements sent one at a time (Exec, Query, QueryRow), each a round
	// trip, BEGIN and COMMIT included.
	Statements int64
	// Batches sent, each a round trip however many statements it holds.
	Batches int64
	// Commits is the number of transactions committed: each successful
	// COMMIT, and each successful statement or batch run outside a
	// transaction block, which PostgreSQL commits on its own.
	Commits int64
}

// RoundTrips is Statements plus Batches.
func (c Counts) RoundTrips() int64 { return c.Statements + c.Batches }

// Sub returns c - d, for counting what happened between two snapshots.
func (c Counts) Sub(d Counts) Counts {
	return Counts{Statements: c.Statements - d.Statements, Batches: c.Batches - d.Batches, Commits: c.Commits - d.Commits}
}

// Counts returns the counts so far.
func (c *Counter) Counts() Counts {
	return Counts{Statements: c.statements.Load(), Batches: c.batches.Load(), Commits: c.commits.Load()}
}

type startKey struct{}

// start records whether the connection was outside a transaction block.
type start struct {
	idle bool
	sql  string
}

// TraceQueryStart notes whether the statement runs outside a transaction.
func (c *Counter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.statements.Add(1)
	return context.WithValue(ctx, startKey{}, start{idle: conn.PgConn().TxStatus() == 'I', sql: data.SQL})
}

// TraceQueryEnd counts a commit when one happened.
func (c *Counter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	s, _ := ctx.Value(startKey{}).(start)
	if data.Err != nil {
		return
	}
	switch {
	case data.CommandTag.String() == "COMMIT":
		c.commits.Add(1)
	case s.idle && !isBegin(s.sql):
		c.commits.Add(1) // an implicit transaction
	}
}

type batchKey struct{}

// batch is what a batch's trace remembers between its calls.
type batch struct {
	idle      bool // started outside a transaction block
	committed bool // held a COMMIT
}

// TraceBatchStart counts the batch as one round trip.
func (c *Counter) TraceBatchStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.batches.Add(1)
	return context.WithValue(ctx, batchKey{}, &batch{idle: conn.PgConn().TxStatus() == 'I'})
}

// TraceBatchQuery sees each statement of a batch; a COMMIT in it counts.
func (c *Counter) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if data.Err == nil && data.CommandTag.String() == "COMMIT" {
		c.commits.Add(1)
		if b, ok := ctx.Value(batchKey{}).(*batch); ok {
			b.committed = true
		}
	}
}

// TraceBatchEnd counts a batch that ran wholly outside a transaction block
// as one implicit transaction.
func (c *Counter) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	b, _ := ctx.Value(batchKey{}).(*batch)
	if data.Err == nil && b != nil && b.idle && !b.committed && conn.PgConn().TxStatus() == 'I' {
		c.commits.Add(1)
	}
}

// isBegin reports a statement that opens a transaction block, whatever its
// options ("begin isolation level read committed").
func isBegin(sql string) bool {
	s := strings.ToLower(strings.TrimSpace(sql))
	return s == "begin" || strings.HasPrefix(s, "begin ") || strings.HasPrefix(s, "start transaction")
}
