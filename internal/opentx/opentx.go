// Package opentx lends a transaction that its owner opened and ends: the
// pgx.Tx an atomic phase of a workflow, or a handler behind
// idemhttp.Middleware, gets. It behaves as a pgx.Tx (statements, batches,
// COPY, savepoints as nested transactions) except that Commit and
// Rollback, and a statement that would end the transaction, are refused:
// the owner commits it together with its key record.
//
// A statement that ends the transaction can still reach the server inside
// a string of several, and some (COMMIT AND CHAIN, COMMIT; BEGIN) leave a
// new transaction open in its place, which no status on the connection
// tells apart. So the owner marks each transaction it opens, with a value
// of its own in a transaction-local setting (SetMarkSQL), and its COMMIT
// goes behind a check of that mark (recovery's onceflow_same_transaction):
// a transaction that lost the mark was ended or restarted by its borrower,
// and the check keeps the COMMIT from committing what the new transaction
// wrote.
package opentx

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrOwnerEnds is what Commit or Rollback return, and a statement that
// would end the transaction: its owner (the workflow engine, the HTTP
// middleware) ends it, with the key record.
var ErrOwnerEnds = errors.New("onceflow: the engine or the middleware commits or rolls back this transaction; return an error to roll it back")

// ErrEnded reports a transaction its borrower ended or restarted: a COMMIT
// or ROLLBACK (AND CHAIN, or followed by a BEGIN) sent inside a string of
// several statements, which the guard on each statement cannot see. What
// the borrower wrote before it may be committed without the owner's record.
var ErrEnded = errors.New("onceflow: the transaction lent to the phase or handler was ended or restarted inside it, so its writes may be committed without the recovery point or the response")

// MarkSetting is the transaction-local setting that holds a transaction's
// mark.
const MarkSetting = "onceflow.transaction"

// SetMarkSQL marks the transaction open on the connection with $1 (see
// NewMark). It goes in the round trip that opens the transaction.
const SetMarkSQL = "select pg_catalog.set_config('" + MarkSetting + "', $1, true)"

// NewMark returns a mark for a transaction: random, so that no other
// transaction, earlier or later on the connection, carries it.
func NewMark() string { return rand.Text() }

// Tx is the pgx.Tx lent for a transaction on conn. Its owner opens the
// transaction with a statement of its own (a claim), or leaves the BEGIN
// to go with the first statement, and ends it with its fenced write and
// the COMMIT: one round trip each, so the borrower sees a transaction but
// may not end it. Begin makes savepoints, as pgx's nested transactions do.
type Tx struct {
	conn *pgx.Conn
	// begin is the BEGIN not sent yet: it goes with the first statement,
	// and with SetMarkSQL.
	begin string
	// mark is the value of MarkSetting in the transaction (see Mark).
	mark      string
	savepoint int
	lobs      pgx.Tx // for LargeObjects, made on first use
	// restarted is set once a statement the borrower sent is found to
	// have ended or restarted the transaction (see Ended).
	restarted bool

	// mu is held by each call of the borrower's, and over is set by End:
	// a borrower that kept the Tx past its turn (a goroutine it started)
	// gets pgx.ErrTxClosed instead of writing into whatever transaction is
	// open on the connection by then, another request's.
	mu   sync.Mutex
	over bool
}

// End refuses every later call of the borrower's with pgx.ErrTxClosed,
// after waiting for a call in progress. The owner calls it once the
// borrower's turn is over, before it ends the transaction and hands the
// connection back. Open stays the owner's.
func (t *Tx) End() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.over = true
}

// use takes t for one call of the borrower's; done gives it back. It
// fails once End was called.
func (t *Tx) use() (done func(), err error) {
	t.mu.Lock()
	if t.over {
		t.mu.Unlock()
		return nil, pgx.ErrTxClosed
	}
	return t.mu.Unlock, nil
}

// New returns the Tx for the transaction its owner opened on conn and
// marked with mark (SetMarkSQL), or, when begin is set, for the one begin
// opens with the first statement sent, which New marks with mark then.
func New(conn *pgx.Conn, begin, mark string) *Tx { return &Tx{conn: conn, begin: begin, mark: mark} }

// Mark returns the transaction's mark: the owner's COMMIT goes behind a
// check that the transaction still carries it.
func (t *Tx) Mark() string { return t.mark }

// queueBegin queues the pending BEGIN and the statement that marks the
// transaction; the batch's first two results are theirs.
func (t *Tx) queueBegin(b *pgx.Batch) {
	b.Queue(t.begin)
	b.Queue(SetMarkSQL, t.mark)
}

// execBegin reads the results of queueBegin's statements from br.
func execBegin(br pgx.BatchResults) error {
	for range 2 {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	return nil
}

// Open sends a pending BEGIN on its own, with the statement that marks the
// transaction.
func (t *Tx) Open(ctx context.Context) error {
	if t.begin == "" {
		return nil
	}
	b := &pgx.Batch{}
	t.queueBegin(b)
	br := t.conn.SendBatch(ctx, b)
	err := execBegin(br)
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return err
	}
	t.begin = ""
	return nil
}

// pipelines reports whether a statement can go in one batch with the
// pending BEGIN: it has arguments (a statement without is sent with the
// simple protocol, which allows several in one string) and no pgx options.
func (t *Tx) pipelines(args []any) bool {
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
func (t *Tx) withBegin(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	t.queueBegin(b)
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	if err := execBegin(br); err != nil {
		_ = br.Close()
		return nil, err
	}
	t.begin = ""
	return br, nil
}

func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	done, err := t.use()
	if err != nil {
		return nil, err
	}
	defer done()
	if err := t.Open(ctx); err != nil {
		return nil, err
	}
	t.savepoint++
	name := fmt.Sprintf("onceflow_sp_%d", t.savepoint)
	if _, err := t.conn.Exec(ctx, "savepoint "+name); err != nil {
		return nil, err
	}
	return &savepointTx{Tx: t, name: name}, nil
}

func (t *Tx) Commit(context.Context) error   { return ErrOwnerEnds }
func (t *Tx) Rollback(context.Context) error { return ErrOwnerEnds }

func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	done, err := t.use()
	if err != nil {
		return 0, err
	}
	defer done()
	if err := t.Open(ctx); err != nil {
		return 0, err
	}
	return t.conn.CopyFrom(ctx, table, columns, src)
}

func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	done, err := t.use()
	if err != nil {
		return errBatch{err: err}
	}
	defer done()
	for _, q := range b.QueuedQueries {
		if endsTransaction(q.SQL) {
			return errBatch{err: ErrOwnerEnds}
		}
	}
	if t.begin != "" {
		opening := &pgx.Batch{}
		t.queueBegin(opening)
		b.QueuedQueries = append(opening.QueuedQueries, b.QueuedQueries...)
		t.begin = ""
		br := t.conn.SendBatch(ctx, b)
		if err := execBegin(br); err != nil {
			return errBatch{br, err}
		}
		return br
	}
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects works on the transaction; the first call costs a
// round trip.
func (t *Tx) LargeObjects() pgx.LargeObjects {
	done, err := t.use()
	if err != nil {
		return pgx.LargeObjects{}
	}
	defer done()
	if t.lobs == nil {
		if err := t.Open(context.Background()); err != nil {
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

func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	done, err := t.use()
	if err != nil {
		return nil, err
	}
	defer done()
	if endsTransaction(sql) {
		return nil, ErrOwnerEnds
	}
	return t.conn.Prepare(ctx, name, sql)
}

func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	done, err := t.use()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer done()
	if endsTransaction(sql) {
		return pgconn.CommandTag{}, ErrOwnerEnds
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
	if err := t.Open(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := t.conn.Exec(ctx, sql, args...)
	if len(args) == 0 && mayRestart(sql) {
		t.checkMark(ctx)
	}
	return tag, err
}

// Restarted reports whether the borrower ended or restarted the
// transaction, asking the server when nothing seen so far tells (Ended):
// one round trip, for an owner about to roll back, which otherwise never
// learns that writes it rolls back were committed before. A transaction
// not begun, or aborted by a failed statement (which takes no query), is
// reported as not restarted.
func (t *Tx) Restarted(ctx context.Context) bool {
	if t == nil || t.begin != "" {
		return false
	}
	if t.Ended() {
		return true
	}
	if pc := t.conn.PgConn(); pc.IsClosed() || pc.TxStatus() != 'T' {
		return false
	}
	t.checkMark(ctx)
	return t.restarted
}

// checkMark asks the server whether the transaction still carries its
// mark, after a string of statements that may have ended or restarted it,
// and notes the answer for Ended. An error leaves the question to the
// owner's check at its COMMIT.
func (t *Tx) checkMark(ctx context.Context) {
	var same bool
	err := t.conn.QueryRow(ctx, "select coalesce(current_setting('"+MarkSetting+"', true), '') = $1", t.mark).Scan(&same)
	if err == nil && !same {
		t.restarted = true
	}
}

// mayRestart reports whether sql, sent without arguments (so on the simple
// protocol, which runs a string of several statements), is a string of
// several of which one may end or restart the transaction: the guard on
// its first words (endsTransaction) saw only the first. It errs on the
// side of asking the server.
func mayRestart(sql string) bool {
	if !strings.Contains(sql, ";") {
		return false
	}
	notLetter := func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '_') }
	for _, word := range strings.FieldsFunc(sql, notLetter) {
		switch strings.ToLower(word) {
		case "commit", "rollback", "abort", "end", "begin", "start", "prepare":
			return true
		}
	}
	return false
}

func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	done, err := t.use()
	if err != nil {
		return nil, err
	}
	defer done()
	if endsTransaction(sql) {
		return nil, ErrOwnerEnds
	}
	if err := t.Open(ctx); err != nil {
		return nil, err
	}
	return t.conn.Query(ctx, sql, args...)
}

func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	done, err := t.use()
	if err != nil {
		return errRow{err}
	}
	defer done()
	if endsTransaction(sql) {
		return errRow{ErrOwnerEnds}
	}
	if t.pipelines(args) {
		br, err := t.withBegin(ctx, sql, args)
		if err != nil {
			return errRow{err}
		}
		return batchRow{br}
	}
	if err := t.Open(ctx); err != nil {
		return errRow{err}
	}
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *Tx) Conn() *pgx.Conn { return t.conn }

// savepointTx is a nested transaction: a savepoint.
type savepointTx struct {
	*Tx
	name   string
	closed bool
}

func (s *savepointTx) Commit(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	done, err := s.use()
	if err != nil {
		return err
	}
	defer done()
	s.closed = true
	_, err = s.conn.Exec(ctx, "release savepoint "+s.name)
	return err
}

func (s *savepointTx) Rollback(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	done, err := s.use()
	if err != nil {
		return err
	}
	defer done()
	s.closed = true
	_, err = s.conn.Exec(ctx, "rollback to savepoint "+s.name)
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

// Ended reports whether the transaction is over while its connection
// lives, as far as the owner can tell without asking the server: a
// statement the borrower sent (a COMMIT in a string of several, say) ended
// it, or ended it and began another (COMMIT AND CHAIN; COMMIT; BEGIN), as
// Exec found when it asked. A connection that died took its transaction
// with it, uncommitted. The owner's COMMIT checks the mark besides, which
// catches what a batch, a query or Conn() ended.
func (t *Tx) Ended() bool {
	if t == nil || t.begin != "" {
		return false
	}
	pc := t.conn.PgConn()
	return !pc.IsClosed() && (t.restarted || pc.TxStatus() == 'I')
}

// endsTransaction reports whether sql starts with a statement that would
// end the transaction (COMMIT, END, ROLLBACK or ABORT other than to
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
