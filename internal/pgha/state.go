package pgha

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/child"
)

// pollInterval is how often a wait asks the monitor or a node again.
const pollInterval = 50 * time.Millisecond

// logLines is how many lines of each keeper's log a WaitError quotes.
const logLines = 12

// ErrNoPrimary reports that the monitor has no node settled as the
// primary: a failover is under way, or no node can take writes.
var ErrNoPrimary = errors.New("pgha: no node is the primary")

// WaitError reports a wait that did not end within its bound. Its message
// ends with the last lines of every keeper's log, which tell why.
type WaitError struct {
	// What is what was waited for.
	What string
	// After is the bound that passed.
	After time.Duration
	// Err is the last error met while waiting, if any.
	Err error
	// Logs are the last lines of the keepers' logs.
	Logs string
}

func (e *WaitError) Error() string {
	msg := fmt.Sprintf("pgha: %s: not within %s", e.What, e.After)
	if e.Err != nil {
		msg += " (last: " + e.Err.Error() + ")"
	}
	return msg + "; keepers' logs:\n" + e.Logs
}

func (e *WaitError) Unwrap() error { return e.Err }

// waitFor calls cond every pollInterval until it holds, and fails with a
// WaitError after timeout, when ctx ends, or at once when a keeper that
// should run has exited. Errors cond returns are remembered, not fatal:
// nodes refuse connections while they fail over.
func (f *Formation) waitFor(ctx context.Context, timeout time.Duration, what string, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		ok, err := cond(ctx)
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if exited := f.exitedKeeper(); exited != "" {
			return &WaitError{What: what, After: timeout, Err: fmt.Errorf("the keeper of %s exited", exited), Logs: f.logTails()}
		}
		select {
		case <-ctx.Done():
			return &WaitError{What: what, After: timeout, Err: errors.Join(last, ctx.Err()), Logs: f.logTails()}
		case <-time.After(pollInterval):
		}
	}
}

// exitedKeeper names a node whose keeper should run and has exited.
func (f *Formation) exitedKeeper() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range append([]*Node{f.monitor}, f.nodes...) {
		if n.keeper == nil {
			continue
		}
		select {
		case <-n.keeper.Exited():
			return n.Name
		default:
		}
	}
	return ""
}

// logTails quotes the last lines of every keeper's log.
func (f *Formation) logTails() string {
	var b strings.Builder
	for _, n := range append([]*Node{f.monitor}, f.nodes...) {
		if n == nil {
			continue
		}
		log, _ := os.ReadFile(n.log)
		fmt.Fprintf(&b, "%s: %s\n", n.Name, child.LastLines(log, logLines))
	}
	return b.String()
}

// nodeState is a node's state at the monitor: the one its keeper reported
// and the one the monitor assigned it.
type nodeState struct{ reported, assigned string }

// settled reports whether the node reached the state it was assigned.
func (s nodeState) settled() bool { return s.reported == s.assigned }

// states asks the monitor for every data node's state, by name.
func (f *Formation) states(ctx context.Context) (map[string]nodeState, error) {
	conn, err := pgx.Connect(ctx, f.nodeURL(f.monitor, "pg_auto_failover"))
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node`)
	if err != nil {
		return nil, err
	}
	states := map[string]nodeState{}
	var name string
	var s nodeState
	_, err = pgx.ForEachRow(rows, []any{&name, &s.reported, &s.assigned}, func() error {
		states[name] = s
		return nil
	})
	return states, err
}

// monitorReady is a wait's condition: the monitor answers with its
// extension installed.
func (f *Formation) monitorReady(ctx context.Context) (bool, error) {
	_, err := f.states(ctx)
	return err == nil, err
}

// inState is a wait's condition: node n settled in state.
func (f *Formation) inState(n *Node, state string) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		states, err := f.states(ctx)
		s := states[n.Name]
		return err == nil && s.settled() && s.assigned == state, err
	}
}

// isPrimary reports whether a node in state s takes writes as the
// formation's primary: alone (single), with a standby that is not yet
// caught up (wait_primary), or with it (primary).
func isPrimary(s nodeState) bool {
	return s.settled() && (s.assigned == "single" || s.assigned == "wait_primary" || s.assigned == "primary")
}

// Primary returns the node the monitor has settled as the primary, or
// ErrNoPrimary.
func (f *Formation) Primary(ctx context.Context) (*Node, error) {
	states, err := f.states(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgha: ask the monitor: %w", err)
	}
	for _, n := range f.nodes {
		if isPrimary(states[n.Name]) {
			return n, nil
		}
	}
	return nil, ErrNoPrimary
}

// WaitPrimary waits, for at most timeout, until node n is the primary and
// a connection through URL reaches it and may write.
func (f *Formation) WaitPrimary(ctx context.Context, n *Node, timeout time.Duration) error {
	return f.waitFor(ctx, timeout, n.Name+" is the primary", func(ctx context.Context) (bool, error) {
		states, err := f.states(ctx)
		if err != nil || !isPrimary(states[n.Name]) {
			return false, err
		}
		var port int
		err = f.queryRow(ctx, f.URL(), `SELECT current_setting('port')::int`, nil, &port)
		return err == nil && port == n.Port, err
	})
}

// WaitSecondary waits, for at most timeout, until node n is the standby
// of a primary, both settled: after Start, or after Rejoin once the node
// has been rewound and caught up.
func (f *Formation) WaitSecondary(ctx context.Context, n *Node, timeout time.Duration) error {
	return f.waitFor(ctx, timeout, n.Name+" is the standby of a primary", func(ctx context.Context) (bool, error) {
		states, err := f.states(ctx)
		if err != nil {
			return false, err
		}
		s := states[n.Name]
		if !s.settled() || s.assigned != "secondary" {
			return false, nil
		}
		for _, other := range f.nodes {
			if other != n && states[other.Name].settled() && states[other.Name].assigned == "primary" {
				return true, nil
			}
		}
		return false, nil
	})
}

// SetAsync makes the formation's replication asynchronous: no node counts
// in the write quorum, so the primary commits without waiting for the
// standby (synchronous_standby_names is empty). It returns, within
// timeout, once the primary applies it.
func (f *Formation) SetAsync(ctx context.Context, timeout time.Duration) error {
	return f.setQuorum(ctx, false, timeout)
}

// SetSync makes the formation's replication synchronous again, as Start
// builds it: the primary commits once the standby has the commit.
func (f *Formation) SetSync(ctx context.Context, timeout time.Duration) error {
	return f.setQuorum(ctx, true, timeout)
}

// setQuorum puts every node in the write quorum or out of it and waits
// until the primary's synchronous_standby_names says so.
func (f *Formation) setQuorum(ctx context.Context, quorum bool, timeout time.Duration) error {
	conn, err := pgx.Connect(ctx, f.nodeURL(f.monitor, "pg_auto_failover"))
	if err != nil {
		return fmt.Errorf("pgha: connect to the monitor: %w", err)
	}
	defer conn.Close(ctx)
	for _, n := range f.nodes {
		if err := setNodeQuorum(ctx, conn, n.Name, quorum); err != nil {
			return fmt.Errorf("pgha: replication quorum of %s: %w", n.Name, err)
		}
	}
	what := fmt.Sprintf("the primary's replication is synchronous: %t", quorum)
	return f.waitFor(ctx, timeout, what, func(ctx context.Context) (bool, error) {
		p, err := f.Primary(ctx)
		if err != nil {
			return false, err
		}
		var names string
		err = f.queryRow(ctx, f.NodeURL(p), `SELECT current_setting('synchronous_standby_names')`, nil, &names)
		return err == nil && (names != "") == quorum, err
	})
}

// quorumTries bounds how often setNodeQuorum asks the monitor again
// after a deadlock.
const quorumTries = 5

// setNodeQuorum asks the monitor to put node name in the write quorum or
// out of it. The monitor's function takes the formation's locks that the
// keepers' own reports take too, in its own order: PostgreSQL may end it
// as a deadlock (40P01) when a keeper reports at that moment, so it is
// asked again, a bounded number of times.
func setNodeQuorum(ctx context.Context, conn *pgx.Conn, name string, quorum bool) error {
	for try := 1; ; try++ {
		_, err := conn.Exec(ctx, `SELECT pgautofailover.set_node_replication_quorum('default', $1, $2)`, name, quorum)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "40P01" || try == quorumTries {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

// PauseReplication stops the primary's WAL senders (SIGSTOP) until resume
// is called: from then on, what the primary commits is on the primary
// alone. With asynchronous replication, commits go on; a failover before
// resume loses them. With synchronous replication, commits wait. A WAL
// sender that dies with its node in the meantime needs no resume.
func (f *Formation) PauseReplication(ctx context.Context) (resume func(), err error) {
	p, err := f.Primary(ctx)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, f.NodeURL(p))
	if err != nil {
		return nil, fmt.Errorf("pgha: connect to the primary: %w", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_replication`)
	if err != nil {
		return nil, fmt.Errorf("pgha: the primary's WAL senders: %w", err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("pgha: the primary's WAL senders: %w", err)
	}
	if len(pids) == 0 {
		return nil, fmt.Errorf("pgha: %s has no WAL sender: no standby streams from it", p.Name)
	}
	resume = func() {
		for _, pid := range pids {
			_ = syscall.Kill(int(pid), syscall.SIGCONT)
		}
	}
	for _, pid := range pids {
		if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
			resume()
			return nil, fmt.Errorf("pgha: stop WAL sender %d: %w", pid, err)
		}
	}
	return resume, nil
}

// WaitReplicated waits, for at most timeout, until every standby has
// replayed what the primary had written when it was called: a commit
// acknowledged before the call survives a failover after it, whatever
// the replication mode.
func (f *Formation) WaitReplicated(ctx context.Context, timeout time.Duration) error {
	p, err := f.Primary(ctx)
	if err != nil {
		return err
	}
	var lsn string
	if err := f.queryRow(ctx, f.NodeURL(p), `SELECT pg_current_wal_lsn()::text`, nil, &lsn); err != nil {
		return fmt.Errorf("pgha: the primary's position: %w", err)
	}
	for _, n := range f.nodes {
		if n == p {
			continue
		}
		err := f.waitFor(ctx, timeout, n.Name+" replayed "+lsn, func(ctx context.Context) (bool, error) {
			var done bool
			err := f.queryRow(ctx, f.NodeURL(n), `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, []any{lsn}, &done)
			return done, err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// queryRow runs sql with args on a new connection to url and scans its row
// into dest.
func (f *Formation) queryRow(ctx context.Context, url, sql string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}
