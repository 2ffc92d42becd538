package pgproxy_test

import (
	"context"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/pgproxy"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// bundle is one test's database, seen directly and through a proxy.
type bundle struct {
	t       *testing.T
	ctx     context.Context
	direct  *pgxpool.Pool // for the assertions: never faulted
	proxy   *pgproxy.Proxy
	proxied string // the database's URL through the proxy
	dbURL   string // the database's URL (through PgBouncer when the tests use it)
}

// setup makes t's bundle and runs t in parallel with the others.
func setup(t *testing.T) *bundle {
	t.Helper()
	t.Parallel()
	return newBundle(t)
}

func newBundle(t *testing.T) *bundle {
	t.Helper()
	dbURL := dbtest.NewDatabase(t, dbtest.Options{})
	direct := dbtest.Connect(t, dbURL, 4)
	proxy, proxied := pgproxy.Start(t, dbURL)
	// A proxy that holds a reply it should forward makes the client wait:
	// the deadline turns that into a failure.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	b := &bundle{t: t, ctx: ctx, direct: direct, proxy: proxy, proxied: proxied, dbURL: dbURL}
	_, err := direct.Exec(b.ctx, `CREATE TABLE ledger (n int NOT NULL)`)
	require.NoError(t, err)
	return b
}

// connect opens a connection through the proxy, closed when the test ends.
func (b *bundle) connect() *pgx.Conn {
	b.t.Helper()
	conn, err := pgx.Connect(b.ctx, b.proxied)
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// rows returns the ledger's entries, read directly.
func (b *bundle) rows() []int {
	b.t.Helper()
	rows, err := b.direct.Query(b.ctx, `SELECT n FROM ledger ORDER BY n`)
	require.NoError(b.t, err)
	ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(b.t, err)
	return ns
}

func TestForwardsEverythingElse(t *testing.T) {
	b := setup(t)
	// sslmode=prefer asks for TLS first: the proxy refuses, and the client
	// goes on in plain text.
	u, err := url.Parse(b.proxied)
	require.NoError(t, err)
	q := u.Query()
	q.Set("sslmode", "prefer")
	u.RawQuery = q.Encode()
	conn, err := pgx.Connect(b.ctx, u.String())
	require.NoError(t, err)
	defer conn.Close(b.ctx)
	armed := b.proxy.Arm(pgproxy.Rule{Match: pgproxy.Containing("no statement says this"), Fault: pgproxy.LoseRequest})

	_, err = conn.Exec(b.ctx, `INSERT INTO ledger VALUES (1)`) // simple protocol
	require.NoError(t, err)
	for n := 2; n <= 3; n++ { // prepared, then bound again
		_, err = conn.Exec(b.ctx, `INSERT INTO ledger VALUES ($1)`, n)
		require.NoError(t, err)
	}
	batch := &pgx.Batch{}
	batch.Queue(`INSERT INTO ledger VALUES ($1)`, 4)
	batch.Queue(`INSERT INTO ledger VALUES ($1)`, 5)
	require.NoError(t, conn.SendBatch(b.ctx, batch).Close())
	copied, err := conn.CopyFrom(b.ctx, pgx.Identifier{"ledger"}, []string{"n"}, pgx.CopyFromRows([][]any{{6}, {7}}))
	require.NoError(t, err)
	require.EqualValues(t, 2, copied)
	big := strings.Repeat("x", 1<<20) // longer than any buffer on the way
	var echoed string
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT $1::text`, big).Scan(&echoed))
	require.Equal(t, big, echoed)
	_, err = conn.Exec(b.ctx, `SELECT * FROM no_such_table`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the server's errors pass too")
	require.Equal(t, "42P01", pgErr.Code)

	require.Equal(t, []int{1, 2, 3, 4, 5, 6, 7}, b.rows())
	require.Zero(t, armed.Fired())
}

// TestFaults loses a statement's acknowledgement or its request in each way
// pgx sends one: after a lost acknowledgement the client got an error
// although the server committed; after a lost request it got the same
// error and nothing was committed.
func TestFaults(t *testing.T) {
	t.Parallel()
	shapes := []struct {
		name  string
		match func(string) bool
		// send runs the faulted statement, which inserts n.
		send func(ctx context.Context, conn *pgx.Conn, n int) error
	}{
		{"simple query", pgproxy.Containing("INSERT INTO ledger"), func(ctx context.Context, conn *pgx.Conn, n int) error {
			_, err := conn.Exec(ctx, `INSERT INTO ledger SELECT `+strconv.Itoa(n))
			return err
		}},
		{"statement prepared on an earlier round trip", pgproxy.Containing("INSERT INTO ledger"), func(ctx context.Context, conn *pgx.Conn, n int) error {
			_, err := conn.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, n)
			return err
		}},
		{"commit batched with a write", pgproxy.Statement("commit"), func(ctx context.Context, conn *pgx.Conn, n int) error {
			if _, err := conn.Exec(ctx, "begin isolation level read committed"); err != nil {
				return err
			}
			batch := &pgx.Batch{}
			batch.Queue(`INSERT INTO ledger VALUES ($1)`, n)
			batch.Queue("commit")
			return conn.SendBatch(ctx, batch).Close()
		}},
	}
	for _, shape := range shapes {
		for _, fault := range []pgproxy.Fault{pgproxy.LoseAcknowledgement, pgproxy.LoseRequest} {
			t.Run(shape.name+"/"+fault.String(), func(t *testing.T) {
				b := setup(t)
				conn := b.connect()
				// Once unfaulted: this prepares the statement and caches
				// it, so the faulted run sends no Parse.
				require.NoError(t, shape.send(b.ctx, conn, 1))

				armed := b.proxy.Arm(pgproxy.Rule{Match: shape.match, Fault: fault})
				err := shape.send(b.ctx, conn, 2)
				require.Error(t, err, "the client sees the fault")
				require.True(t, conn.IsClosed())
				require.Equal(t, 1, armed.Fired())
				if fault == pgproxy.LoseAcknowledgement {
					require.Equal(t, []int{1, 2}, b.rows(), "the server committed what the client was not told of")
				} else {
					require.Equal(t, []int{1}, b.rows(), "the server never got the request")
				}

				require.NoError(t, shape.send(b.ctx, b.connect(), 3), "the rule fired once")
				require.Equal(t, 1, armed.Fired())
			})
		}
	}
}

// TestRuleSkipsThenFiresTimes: a rule lets the matches it skips pass,
// faults as many as it was armed for, and lets the rest pass; statements
// it does not match pass all along. A disarmed rule faults nothing.
func TestRuleSkipsThenFiresTimes(t *testing.T) {
	b := setup(t)
	armed := b.proxy.Arm(pgproxy.Rule{Match: pgproxy.Statement("INSERT INTO ledger VALUES (7)"),
		Fault: pgproxy.LoseAcknowledgement, Skip: 1, Times: 2})
	disarmed := b.proxy.Arm(pgproxy.Rule{Match: pgproxy.Containing("INSERT"), Fault: pgproxy.LoseRequest, Skip: 5})
	b.proxy.Disarm(disarmed)
	faulted := []bool{false, true, true, false}
	for i, want := range faulted {
		conn := b.connect()
		_, err := conn.Exec(b.ctx, `INSERT INTO ledger VALUES (1)`)
		require.NoError(t, err, "a statement the rule does not match passes")
		_, err = conn.Exec(b.ctx, `INSERT INTO ledger VALUES (7)`)
		if want {
			require.Error(t, err, "match %d is faulted", i+1)
		} else {
			require.NoError(t, err, "match %d passes", i+1)
		}
	}
	require.Equal(t, 2, armed.Fired())
	require.Zero(t, disarmed.Fired())
	require.Equal(t, []int{1, 1, 1, 1, 7, 7, 7, 7}, b.rows(), "a lost acknowledgement loses no write")
}

// TestCancelRequestReachesTheServer: a CancelRequest goes through the proxy
// on a connection of its own and cancels the query.
func TestCancelRequestReachesTheServer(t *testing.T) {
	b := setup(t)
	conn := b.connect()
	// PostgreSQL itself says when the query runs: behind PgBouncer, the
	// client's backend PID is PgBouncer's own.
	server := dbtest.Connect(t, dbtest.DirectURL(t, b.dbURL), 1)
	const sleep = `SELECT pg_sleep(60) -- to cancel`
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(b.ctx, sleep)
		done <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		err := server.QueryRow(b.ctx,
			`SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'active'`, sleep).Scan(&n)
		return err == nil && n == 1
	}, 30*time.Second, 10*time.Millisecond, "the query runs")
	require.NoError(t, conn.PgConn().CancelRequest(b.ctx))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, <-done, &pgErr)
	require.Equal(t, "57014", pgErr.Code, "query_canceled: the server got the cancel request")
}

// TestCloseEndsEveryConnection: Close ends the connections through the
// proxy and every goroutine the proxy started. It does not run in parallel:
// the other tests' proxies would be in the goroutine check.
func TestCloseEndsEveryConnection(t *testing.T) {
	b := newBundle(t)
	idle := b.connect()
	busy := b.connect()
	done := make(chan error, 1)
	go func() {
		_, err := busy.Exec(b.ctx, `SELECT pg_sleep(60)`)
		done <- err
	}()
	require.NoError(t, idle.Ping(b.ctx))

	b.proxy.Close()
	b.proxy.Close() // twice is fine
	require.Error(t, <-done, "a statement in progress fails")
	require.Error(t, idle.Ping(b.ctx))
	_, err := pgx.Connect(b.ctx, b.proxied)
	require.Error(t, err, "the proxy accepts no more")
	requireNoProxyGoroutines(t)
}

// requireNoProxyGoroutines fails when a goroutine runs the proxy's code.
// Close waits for them all; the scheduler may take a moment to retire one
// that has just signalled it ended.
func requireNoProxyGoroutines(t *testing.T) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		buf := make([]byte, 1<<20)
		var left []string
		for g := range strings.SplitSeq(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "onceflow/internal/pgproxy.(*") {
				left = append(left, g)
			}
		}
		assert.Empty(c, left, "goroutines of the proxy")
	}, 10*time.Second, 10*time.Millisecond)
}

// TestDelay checks that a delayed proxy adds its delay in each direction
// to every round trip, measured on the client's clock, and still forwards
// everything unchanged.
func TestDelay(t *testing.T) {
	t.Parallel()
	const delay = 5 * time.Millisecond
	dbURL := dbtest.NewDatabase(t, dbtest.Options{})
	proxy, proxied, err := pgproxy.For(dbURL, pgproxy.Options{Delay: delay})
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, proxied)
	require.NoError(t, err)
	defer conn.Close(ctx)

	for range 5 {
		started := time.Now()
		_, err := conn.Exec(ctx, `SELECT 1`)
		require.NoError(t, err)
		require.GreaterOrEqual(t, time.Since(started), 2*delay, "a round trip crosses the proxy twice")
	}
	batch := &pgx.Batch{}
	for n := range 3 {
		batch.Queue(`SELECT $1::int`, n)
	}
	started := time.Now()
	results := conn.SendBatch(ctx, batch)
	for n := range 3 {
		var got int
		require.NoError(t, results.QueryRow().Scan(&got))
		require.Equal(t, n, got)
	}
	require.NoError(t, results.Close())
	require.GreaterOrEqual(t, time.Since(started), 2*delay)
	big := strings.Repeat("x", 1<<20)
	var echoed string
	require.NoError(t, conn.QueryRow(ctx, `SELECT $1::text`, big).Scan(&echoed))
	require.Equal(t, big, echoed)
}
