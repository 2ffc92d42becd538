package workflow

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// errEngineEnds is what a step gets from Commit or Rollback on its
// transaction: the engine ends it, with the recovery point.
var errEngineEnds = errors.New("onceflow: the engine commits or rolls back a phase's transaction; return an error to roll it back")

// phaseTx is the pgx.Tx an atomic phase gets for its transaction on conn.
// The engine opens the transaction with the claim, or sends the BEGIN with
// the phase's first statement, and ends it with the recovery point and the
// COMMIT: one round trip each, so the phase sees a transaction but may not
// end it. Begin makes savepoints, as pgx's nested transactions do.
type phaseTx struct {
	conn *pgx.Conn
	// begin is the BEGIN not sent yet: it goes with the first statement.
	begin     string
	savepoint int
	lobs      pgx.Tx // for LargeObjects, made on first use
}

// open sends a pending BEGIN on its own.
func (t *phaseTx) open(ctx context.Context) error {
	if t.begin == "" {
		return nil
	}
	if _, err := t.conn.Exec(ctx, t.begin); err != nil {
		return err
	}
	t.begin = ""
	return nil
}

// pipelines reports whether a statement can go in one batch with the
// pending BEGIN: it has arguments (a statement without is sent with the
// simple protocol, which allows several in one string) and no pgx options.
func (t *phaseTx) pipelines(args []any) bool {
	if t.begin == "" || len(args) == 0 {
		return false
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryRewriter:
		return false
	}
	return true
}

// withBegin sends the pending BEGIN and the statement in one batch and
// returns the batch, positioned at the statement's result.
func (t *phaseTx) withBegin(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	b.Queue(t.begin)
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	t.begin = ""
	return br, nil
}

func (t *phaseTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.open(ctx); err != nil {
		return nil, err
	}
	t.savepoint++
	name := fmt.Sprintf("onceflow_sp_%d", t.savepoint)
	if _, err := t.conn.Exec(ctx, "savepoint "+name); err != nil {
		return nil, err
	}
	return &savepointTx{phaseTx: t, name: name}, nil
}

func (t *phaseTx) Commit(context.Context) error   { return errEngineEnds }
func (t *phaseTx) Rollback(context.Context) error { return errEngineEnds }

func (t *phaseTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.open(ctx); err != nil {
		return 0, err
	}
	return t.conn.CopyFrom(ctx, table, columns, src)
}

func (t *phaseTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		if endsTransaction(q.SQL) {
			return errBatch{err: errEngineEnds}
		}
	}
	if t.begin != "" {
		b.QueuedQueries = append([]*pgx.QueuedQuery{{SQL: t.begin}}, b.QueuedQueries...)
		t.begin = ""
		br := t.conn.SendBatch(ctx, b)
		if _, err := br.Exec(); err != nil {
			return errBatch{br, err}
		}
		return br
	}
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects works on the phase's transaction; the first call costs a
// round trip.
func (t *phaseTx) LargeObjects() pgx.LargeObjects {
	if t.lobs == nil {
		if err := t.open(context.Background()); err != nil {
			return pgx.LargeObjects{}
		}
		tx, err := t.conn.BeginTx(context.Background(), pgx.TxOptions{BeginQuery: "SELECT"})
		if err != nil {
			return pgx.LargeObjects{}
		}
		t.lobs = tx
	}
	return t.lobs.LargeObjects()
}

func (t *phaseTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if endsTransaction(sql) {
		return nil, errEngineEnds
	}
	return t.conn.Prepare(ctx, name, sql)
}

func (t *phaseTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if endsTransaction(sql) {
		return pgconn.CommandTag{}, errEngineEnds
	}
	if t.pipelines(args) {
		br, err := t.withBegin(ctx, sql, args)
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		tag, err := br.Exec()
		if closeErr := br.Close(); err == nil {
			err = closeErr
		}
		return tag, err
	}
	if err := t.open(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.conn.Exec(ctx, sql, args...)
}

func (t *phaseTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if endsTransaction(sql) {
		return nil, errEngineEnds
	}
	if err := t.open(ctx); err != nil {
		return nil, err
	}
	return t.conn.Query(ctx, sql, args...)
}

func (t *phaseTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if endsTransaction(sql) {
		return errRow{errEngineEnds}
	}
	if t.pipelines(args) {
		br, err := t.withBegin(ctx, sql, args)
		if err != nil {
			return errRow{err}
		}
		return batchRow{br}
	}
	if err := t.open(ctx); err != nil {
		return errRow{err}
	}
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *phaseTx) Conn() *pgx.Conn { return t.conn }

// savepointTx is a nested transaction of a phase: a savepoint.
type savepointTx struct {
	*phaseTx
	name   string
	closed bool
}

func (s *savepointTx) Commit(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.conn.Exec(ctx, "release savepoint "+s.name)
	return err
}

func (s *savepointTx) Rollback(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.conn.Exec(ctx, "rollback to savepoint "+s.name)
	return err
}

// batchRow is a row read from a batch, which its Scan finishes.
type batchRow struct{ br pgx.BatchResults }

func (r batchRow) Scan(dest ...any) error {
	err := r.br.QueryRow().Scan(dest...)
	if closeErr := r.br.Close(); err == nil {
		err = closeErr
	}
	return err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errBatch is a batch whose pending BEGIN failed: every result is its error.
type errBatch struct {
	br  pgx.BatchResults
	err error
}

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow{b.err} }
func (b errBatch) Tx() pgx.Tx                       { return nil }
func (b errBatch) Close() error {
	if b.br != nil {
		_ = b.br.Close()
	}
	return b.err
}

// errTxEndedByStep is the cause of a record failed because an atomic phase
// ended its own transaction (see attempt.txEndedByStep).
var errTxEndedByStep = errors.New("the phase committed or rolled back its own transaction, so its writes may be committed without the recovery point; the record failed so that they are not made again")

// ended reports whether the phase's transaction is over while its
// connection lives: a statement the phase sent (a COMMIT in a string of
// several, say) ended it. A connection that died took its transaction with
// it, uncommitted.
func (t *phaseTx) ended() bool {
	if t == nil || t.begin != "" {
		return false
	}
	pc := t.conn.PgConn()
	return !pc.IsClosed() && pc.TxStatus() == 'I'
}

// endsTransaction reports whether sql starts with a statement that would
// end the phase's transaction (COMMIT, END, ROLLBACK or ABORT other than to
// a savepoint, PREPARE TRANSACTION). Statements later in a string of
// several are caught after the fact (ended).
func endsTransaction(sql string) bool {
	words := leadingWords(sql, 3)
	if len(words) == 0 {
		return false
	}
	switch words[0] {
	case "commit", "end":
		return true
	case "prepare":
		return len(words) > 1 && words[1] == "transaction"
	case "rollback", "abort":
		rest := words[1:]
		if len(rest) > 0 && (rest[0] == "work" || rest[0] == "transaction") {
			rest = rest[1:]
		}
		return len(rest) == 0 || rest[0] != "to"
	}
	return false
}

// leadingWords returns up to n words at the start of sql, lower-cased,
// skipping white space and comments.
func leadingWords(sql string, n int) []string {
	var words []string
	for i := 0; i < len(sql) && len(words) < n; {
		switch c := sql[i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
			i++
		case strings.HasPrefix(sql[i:], "--"):
			end := strings.IndexByte(sql[i:], '\n')
			if end < 0 {
				return words
			}
			i += end + 1
		case strings.HasPrefix(sql[i:], "/*"):
			end := strings.Index(sql[i:], "*/") // nested comments are rare at the start
			if end < 0 {
				return words
			}
			i += end + 2
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_':
			j := i
			for j < len(sql) && (sql[j] >= 'a' && sql[j] <= 'z' || sql[j] >= 'A' && sql[j] <= 'Z' || sql[j] == '_') {
				j++
			}
			words = append(words, strings.ToLower(sql[i:j]))
			i = j
		default:
			return words
		}
	}
	return words
}
