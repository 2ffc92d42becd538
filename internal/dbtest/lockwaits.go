package dbtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// LockWaits runs f and returns how often, polling db until f returns, a
// session of db's database was seen waiting for a heavyweight lock (a row,
// a transaction, a table, an advisory lock). A test that proves something
// answers without waiting asserts zero: a wait of milliseconds or more is
// seen, and a run that waits on nothing is never counted.
func LockWaits(t testing.TB, db *pgxpool.Pool, f func()) int {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	waits := 0
	for {
		select {
		case <-done:
			return waits
		default:
		}
		var n int
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			<-done
			t.Fatalf("dbtest: count lock waits: %v", err)
		}
		waits += n
	}
}
