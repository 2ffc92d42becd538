package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// binary is the onceflow command, built once for the tests.
var binary string

func TestMain(m *testing.M) { dbtest.MainWithCommand(m, "onceflow", &binary) }

type result struct {
	stdout, stderr string
	code           int
}

// onceflow runs the built binary with args.
func onceflow(t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), "ONCEFLOW_DATABASE_URL=")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return result{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()}
}

// ok runs onceflow and requires success.
func ok(t *testing.T, args ...string) string {
	t.Helper()
	r := onceflow(t, args...)
	require.Zero(t, r.code, "onceflow %v: %s", args, r.stderr)
	return r.stdout
}

// fails runs onceflow and requires exit code and a one-line error.
func fails(t *testing.T, code int, args ...string) string {
	t.Helper()
	r := onceflow(t, args...)
	require.Equal(t, code, r.code, "onceflow %v: %s%s", args, r.stdout, r.stderr)
	require.True(t, strings.HasPrefix(r.stderr, "onceflow: "), "stderr: %q", r.stderr)
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %q", r.stderr)
	return r.stderr
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true})
	db := "--database-url=" + url

	var status []struct {
		Version int    `json:"version"`
		Name    string `json:"name"`
		Applied bool   `json:"applied"`
	}
	require.NoError(t, json.Unmarshal([]byte(ok(t, "migrate", "status", "--json", db)), &status))
	require.Len(t, status, migrations.Latest())
	require.False(t, status[0].Applied)

	all := migrations.All()
	lines := func(verb string, ms []migrations.Migration) string {
		var b strings.Builder
		for _, m := range ms {
			fmt.Fprintf(&b, "%s %04d_%s\n", verb, m.Version, m.Name)
		}
		return b.String()
	}
	require.Equal(t, "applied 0001_keys\n", ok(t, "migrate", "up", "--to", "1", db))
	require.Equal(t, lines("applied", all[1:]), ok(t, "migrate", "up", db))
	require.Equal(t, "nothing to do\n", ok(t, "migrate", "up", db))
	table := ok(t, "migrate", "status", db)
	require.Contains(t, table, "0002     outbox")
	require.NotContains(t, table, " no\n")

	last := len(all) - 1
	require.Equal(t, lines("reverted", all[last:]), ok(t, "migrate", "down", db))
	rest := slices.Clone(all[:last])
	slices.Reverse(rest)
	require.Equal(t, lines("reverted", rest), ok(t, "migrate", "down", "--to", "0", db))
	require.Contains(t, fails(t, 1, "migrate", "up", "--to", "99", db), "invalid target version")

	other := ok(t, "migrate", "up", "--schema", "idem", db)
	require.Equal(t, lines("applied", all), other)

	require.JSONEq(t, `{"applied": [{"version": 1, "name": "keys"}]}`, ok(t, "migrate", "up", "--json", "--to", "1", db))
	require.JSONEq(t, `{"applied": []}`, ok(t, "migrate", "up", "--json", "--to", "1", db), "nothing to do")
	require.JSONEq(t, `{"reverted": [{"version": 1, "name": "keys"}]}`, ok(t, "migrate", "down", "--json", db))
}

// seedKeys makes a completed key, one in flight and one stuck for hours.
func seedKeys(t *testing.T, url string) {
	t.Helper()
	ctx := context.Background()
	db := dbtest.Connect(t, url, 4)
	wf := workflow.Define("checkout",
		phase.Atomic("create_order", func(context.Context, pgx.Tx, *phase.Run[int, int]) error { return nil }),
		phase.Atomic("charge", func(context.Context, pgx.Tx, *phase.Run[int, int]) error { return nil }),
	)
	e, err := workflow.NewEngine(db, workflow.Config{})
	require.NoError(t, err)
	_, err = wf.Run(ctx, e, workflow.Key{Tenant: "acme", ID: "done"}, 1)
	require.NoError(t, err)
	crashing, err := workflow.NewEngine(db, workflow.Config{Hooks: &workflow.Hooks{
		CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
			if p.Kind == workflow.AfterCommit && p.Step == "create_order" {
				return errors.New("died")
			}
			return nil
		},
	}})
	require.NoError(t, err)
	for _, id := range []string{"running", "stuck"} {
		_, err = wf.Run(ctx, crashing, workflow.Key{Tenant: "globex", ID: id}, 2)
		require.ErrorIs(t, err, workflow.ErrCrashed)
	}
	_, err = db.Exec(ctx, `UPDATE onceflow_keys SET updated_at = now() - interval '3 hours' WHERE key = 'stuck'`)
	require.NoError(t, err)
}

func TestKeys(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	db := "--database-url=" + url
	seedKeys(t, url)

	table := ok(t, "keys", "list", db)
	require.Contains(t, table, "TENANT")
	require.Equal(t, 4, strings.Count(table, "\n"), table)

	var listed []struct {
		Tenant, Key, Status string
		RecoveryPoint       string `json:"recovery_point"`
	}
	require.NoError(t, json.Unmarshal([]byte(ok(t, "keys", "list", "--json", "--stuck-for", "1h", db)), &listed))
	require.Len(t, listed, 1)
	require.Equal(t, "stuck", listed[0].Key)
	require.Equal(t, "create_order", listed[0].RecoveryPoint)
	require.NoError(t, json.Unmarshal([]byte(ok(t, "keys", "list", "--json", "--tenant", "acme", "--status", "completed", db)), &listed))
	require.Len(t, listed, 1)
	require.Equal(t, "done", listed[0].Key)
	require.Contains(t, fails(t, 2, "keys", "list", "--status", "sleeping", db), "--status must be in_flight, parked, completed, failed or compensated")

	var shown struct {
		Status   string
		Response struct {
			Status int
			Body   json.RawMessage
		}
	}
	require.NoError(t, json.Unmarshal([]byte(ok(t, "keys", "show", "acme", "done", "--json", db)), &shown))
	require.Equal(t, "completed", shown.Status)
	require.Equal(t, 200, shown.Response.Status)
	doneRec, err := recovery.New(dbtest.Connect(t, url, 1), recovery.Config{})
	require.NoError(t, err)
	done, err := doneRec.Load(context.Background(), recovery.Key{Tenant: "acme", ID: "done"})
	require.NoError(t, err)
	require.Contains(t, done.Response.Header.Get("Content-Type"), "json")
	require.JSONEq(t, string(done.Response.Body), string(shown.Response.Body), "a JSON body is embedded as JSON, not as a string")
	require.Contains(t, ok(t, "keys", "show", "globex", "stuck", db), "create_order")
	require.Contains(t, fails(t, 1, "keys", "show", "acme", "nope", db), "not found")

	expireLease(t, url, "stuck")
	require.Equal(t, "released key \"stuck\" of tenant \"globex\"\n", ok(t, "keys", "release", "globex", "stuck", "--reason", "node gone", db))
	require.Equal(t, "failed key \"running\" of tenant \"globex\"\n"+
		"the steps committed up to create_order stay committed: nothing was undone\n",
		ok(t, "keys", "fail", "globex", "running", "--force", db))
	require.Contains(t, fails(t, 1, "keys", "release", "acme", "done", db), "is completed: nothing to change")

	store, err := recovery.New(dbtest.Connect(t, url, 2), recovery.Config{})
	require.NoError(t, err)
	stuck, err := store.Load(context.Background(), recovery.Key{Tenant: "globex", ID: "stuck"})
	require.NoError(t, err)
	require.True(t, stuck.Released)
	require.Contains(t, stuck.LastError, "node gone")
	failed, err := store.Load(context.Background(), recovery.Key{Tenant: "globex", ID: "running"})
	require.NoError(t, err)
	require.Equal(t, recovery.StatusFailed, failed.Status)
	require.Equal(t, 500, failed.Response.Status)
}

// TestKeysShowHistory: keys show prints the transitions of a record,
// oldest first, an operator's among them, and --json holds them too.
func TestKeysShowHistory(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	db := "--database-url=" + url
	seedKeys(t, url)
	expireLease(t, url, "stuck")
	ok(t, "keys", "release", "globex", "stuck", "--reason", "node gone", db)
	ok(t, "keys", "fail", "globex", "running", "--force", db)

	shown := ok(t, "keys", "show", "globex", "stuck", db)
	_, history, found := strings.Cut(shown, "\nhistory:\n")
	require.True(t, found, shown)
	lines := strings.Split(strings.TrimSpace(history), "\n")
	require.Len(t, lines, 4, history)
	require.Regexp(t, `^AT\s+TRANSITION\s+OWNER\s+STEP\s+DETAIL$`, lines[0])
	require.Regexp(t, `^\S+\s+claimed\s+[0-9a-f-]{36}\s*$`, lines[1])
	require.Regexp(t, `^\S+\s+phase_committed\s+[0-9a-f-]{36}\s+create_order\s*$`, lines[2])
	require.Regexp(t, `^\S+\s+released_by_operator\s+[0-9a-f-]{36}\s+create_order\s+released by an operator: node gone$`, lines[3])

	var asJSON struct {
		History []struct{ Kind, Step, Error string }
	}
	require.NoError(t, json.Unmarshal([]byte(ok(t, "keys", "show", "globex", "running", "--json", db)), &asJSON))
	kinds := make([]string, len(asJSON.History))
	for i, tr := range asJSON.History {
		kinds[i] = tr.Kind
	}
	require.Equal(t, []string{"claimed", "phase_committed", "failed_by_operator"}, kinds)
	require.Equal(t, "failed by an operator: no reason given", asJSON.History[2].Error)
	require.Contains(t, ok(t, "keys", "show", "acme", "done", db), "completed")
}

// expireLease ends the lease of the key id, as a holder that stopped
// renewing it would have.
func expireLease(t *testing.T, url, id string) {
	t.Helper()
	_, err := dbtest.Connect(t, url, 1).Exec(context.Background(),
		`UPDATE onceflow_keys SET locked_until = clock_timestamp() - interval '1 second' WHERE key = $1`, id)
	require.NoError(t, err)
}

// TestKeysLeaveALiveLeaseAlone: release and fail refuse a key whose lease
// is still valid, since its holder may be at work (a release would let a
// second attempt run beside it); --force overrides, and a lease that ran
// out needs no --force.
func TestKeysLeaveALiveLeaseAlone(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	db := "--database-url=" + url
	seedKeys(t, url)
	store, err := recovery.New(dbtest.Connect(t, url, 2), recovery.Config{})
	require.NoError(t, err)
	load := func(id string) *recovery.Record {
		t.Helper()
		rec, err := store.Load(context.Background(), recovery.Key{Tenant: "globex", ID: id})
		require.NoError(t, err)
		return rec
	}
	before := load("running")
	require.Equal(t, recovery.StatusInFlight, before.Status)
	for _, verb := range []string{"release", "fail"} {
		msg := fails(t, 1, "keys", verb, "globex", "running", db)
		require.Contains(t, msg, "pass --force", verb)
		require.Contains(t, msg, "its holder may still be at work", verb)
	}
	after := load("running")
	require.Equal(t, before.UpdatedAt, after.UpdatedAt, "nothing was written")
	require.False(t, after.Released)

	require.Equal(t, "released key \"running\" of tenant \"globex\"\n", ok(t, "keys", "release", "globex", "running", "--force", db))
	require.True(t, load("running").Released)
	expireLease(t, url, "stuck")
	require.Equal(t, "failed key \"stuck\" of tenant \"globex\"\n"+
		"the steps committed up to create_order stay committed: nothing was undone\n", ok(t, "keys", "fail", "globex", "stuck", db))
	require.Equal(t, recovery.StatusFailed, load("stuck").Status)
}

// TestKeysLeaveALeaseRenewedMeanwhileAlone: release and fail check that the
// lease is over in the statement that writes, not only before it: a holder
// that renews its lease (same owner token) after the command read the
// record keeps the key. The test holds the record's row lock, its lease
// ended, so that the command reads it (a read takes no lock), finds the
// lease over and waits at its write; then it renews the lease with the
// holder's own renewal and commits, and the write, which reads the row
// again, must find the lease valid and leave it.
func TestKeysLeaveALeaseRenewedMeanwhileAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	seedKeys(t, url)
	pool := dbtest.Connect(t, url, 2)
	store, err := recovery.New(pool, recovery.Config{})
	require.NoError(t, err)
	key := recovery.Key{Tenant: "globex", ID: "stuck"}
	for _, verb := range []string{"release", "fail"} {
		expireLease(t, url, key.ID)
		before, err := store.Load(ctx, key)
		require.NoError(t, err)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT 1 FROM onceflow_keys WHERE tenant_id = $1 AND key = $2 FOR UPDATE`, key.Tenant, key.ID)
		require.NoError(t, err)
		done := make(chan result, 1)
		go func() { done <- onceflow(t, "keys", verb, key.Tenant, key.ID, "--database-url="+url) }()
		require.Eventually(t, func() bool {
			var waiting bool
			err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()
				AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' AND query LIKE '%onceflow_keys%')`).Scan(&waiting)
			return err == nil && waiting
		}, time.Minute, 5*time.Millisecond, "%s never reached its write", verb)
		_, err = store.WithTx(tx).Renew(ctx, before.Fence(), 0)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))

		r := <-done
		require.Equal(t, 1, r.code, "%s of a renewed lease: %s%s", verb, r.stdout, r.stderr)
		require.Contains(t, r.stderr, "the key changed while this command ran", verb)
		after, err := store.Load(ctx, key)
		require.NoError(t, err)
		require.Equal(t, recovery.StatusInFlight, after.Status, verb)
		require.False(t, after.Released, verb)
		require.Equal(t, before.Owner, after.Owner, "%s: the holder keeps its lease", verb)
		require.Equal(t, before.Attempts, after.Attempts, verb)
		require.Equal(t, before.LastError, after.LastError, verb)
	}
}

// TestKeysOutputEscapesTerminalSequences: stored bodies and errors come from
// clients; keys show and keys list, as tables and as JSON, and the error
// line, write the characters a terminal acts on as escapes.
func TestKeysOutputEscapesTerminalSequences(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	db := "--database-url=" + url
	seedKeys(t, url)
	// Set the title, clear the screen, an 8-bit CSI, DEL, and a right-to-left override.
	const attack = "\x1b]0;pwned\x07\x1b[2J\u009b31m\x7f\u202eevil"
	_, err := dbtest.Connect(t, url, 1).Exec(context.Background(), `UPDATE onceflow_keys
		SET response_body = CASE key WHEN 'done' THEN convert_to($1, 'UTF8') END,
		    last_error = CASE key WHEN 'stuck' THEN $1 END
		WHERE key IN ('done', 'stuck')`, attack)
	require.NoError(t, err)
	raw := []string{"\x1b", "\x07", "\u009b", "\x7f", "\u202e"}
	clean := func(out, what string) {
		t.Helper()
		for _, c := range raw {
			require.NotContains(t, out, c, "%s holds %q raw: %q", what, c, out)
		}
	}

	shown := ok(t, "keys", "show", "acme", "done", db)
	clean(shown, "keys show")
	require.Contains(t, shown, `\x1b]0;pwned\a\x1b[2J\u009b31m\x7f\u202eevil`)
	listed := ok(t, "keys", "list", db)
	clean(listed, "keys list")
	require.Contains(t, listed, `\x1b]0;pwned`)

	asJSON := ok(t, "keys", "show", "acme", "done", "--json", db)
	clean(asJSON, "keys show --json")
	var shownJSON struct{ Response struct{ Body string } }
	require.NoError(t, json.Unmarshal([]byte(asJSON), &shownJSON))
	require.Equal(t, attack, shownJSON.Response.Body, "the JSON still decodes to the stored bytes")
	listJSON := ok(t, "keys", "list", "--json", db)
	clean(listJSON, "keys list --json")
	var listedJSON []struct {
		LastError string `json:"last_error"`
	}
	require.NoError(t, json.Unmarshal([]byte(listJSON), &listedJSON))
	require.Contains(t, []string{listedJSON[0].LastError, listedJSON[1].LastError, listedJSON[2].LastError}, attack)

	msg := fails(t, 1, "keys", "list", "--database-url=postgres://x@127.0.0.1:1/db"+attack)
	clean(msg, "the error line")
	require.Contains(t, msg, `\x1b]0;pwned`)
}

// TestSchemaInjectionIsRefused: --schema is written into SQL, inside
// dollar-quoted function bodies too; a name that would break out of them
// ($$) or out of its quotes (") is a usage error before anything runs.
func TestSchemaInjectionIsRefused(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true, Settings: map[string]string{"check_function_bodies": "off"}})
	db := "--database-url=" + url
	for _, schema := range []string{
		`a$$;CREATE TABLE IF NOT EXISTS public.pwned();SELECT $$`, // within 63 bytes,
		`x"; CREATE TABLE public.pwned (); --`,
	} {
		for _, args := range [][]string{{"migrate", "up"}, {"keys", "list"}, {"outbox", "list"}, {"sweeper", "--once"}} {
			msg := fails(t, 2, append(args, "--schema", schema, db)...)
			require.Contains(t, msg, "invalid schema name", "%v", args)
		}
	}
	var tables int
	require.NoError(t, dbtest.Connect(t, url, 1).QueryRow(context.Background(),
		`SELECT count(*) FROM pg_class WHERE relname IN ('pwned', 'onceflow_migrations', 'onceflow_keys')`).Scan(&tables))
	require.Zero(t, tables, "nothing ran")
}

func TestOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	db := "--database-url=" + url
	pool := dbtest.Connect(t, url, 4)
	ob, err := outbox.New(outbox.Config{})
	require.NoError(t, err)
	require.NoError(t, ob.Enqueue(ctx, pool,
		outbox.Message{Topic: "receipt", DedupeKey: "r1", Payload: map[string]int{"order": 1}},
		outbox.Message{Topic: "sms", DedupeKey: "s1", Payload: "hi"}))
	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{MaxAttempts: 1, Handlers: map[string]outbox.Handler{
		"receipt": func(context.Context, *outbox.Record) error { return errors.New("mailbox full") },
	}})
	require.NoError(t, err)
	_, err = relay.RunOnce(ctx)
	require.NoError(t, err)

	var dead []outbox.Record
	require.NoError(t, json.Unmarshal([]byte(ok(t, "outbox", "dead", "--json", db)), &dead))
	require.Len(t, dead, 1)
	require.Equal(t, "mailbox full", dead[0].LastError)
	require.Contains(t, ok(t, "outbox", "list", "--topic", "sms", db), "s1")
	require.Contains(t, ok(t, "outbox", "list", db), "mailbox full")

	id := fmt.Sprint(dead[0].ID)
	require.Equal(t, "message "+id+" will be delivered now, with a fresh count of attempts\n", ok(t, "outbox", "retry", id, db))
	var pending []outbox.Record
	require.NoError(t, json.Unmarshal([]byte(ok(t, "outbox", "list", "--status", "pending", "--json", db)), &pending))
	require.Len(t, pending, 2)
	for _, m := range pending {
		id := fmt.Sprint(m.ID)
		require.Equal(t, "message "+id+" will be delivered now, with a fresh count of attempts\n", ok(t, "outbox", "retry", id, db),
			"a pending message too")
	}
	require.Equal(t, "[]\n", ok(t, "outbox", "dead", "--json", db))

	fails(t, 2, "outbox", "retry", "abc", db)
	require.Contains(t, fails(t, 1, "outbox", "retry", "424242", db), "not found")
	fails(t, 2, "outbox", "list", "--status", "lost", db)
}

func TestSweeperOnce(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	seedKeys(t, url)
	pool := dbtest.Connect(t, url, 2)
	_, err := pool.Exec(context.Background(), `UPDATE onceflow_keys SET completed_at = now() - interval '3 hours' WHERE key = 'done';
		UPDATE onceflow_keys SET locked_until = now() - interval '1 second' WHERE status = 'in_flight'`)
	require.NoError(t, err)

	r := onceflow(t, "sweeper", "--once", "--retention", "1h", "--database-url="+url)
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stderr, "pruned")
	require.Contains(t, r.stderr, "abandoned records of a workflow this sweeper cannot resume")
	require.Contains(t, r.stderr, "workflow=checkout records=2")
	require.Contains(t, r.stdout, "pruned: 1 onceflow_keys\n")
	require.Contains(t, r.stdout, "abandoned (resume them where their workflows are defined): 2 checkout\n")
	require.Regexp(t, `oldest key in flight: \d+s\n`, r.stdout)
	require.Contains(t, ok(t, "sweeper", "--once", "--retention", "1h", "--database-url="+url),
		"pruned: nothing\n", "a second run has nothing left to prune")
	var left int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM onceflow_keys`).Scan(&left))
	require.Equal(t, 2, left, "the finished key is pruned; the two in flight stay")

	fails(t, 2, "sweeper", "--once", "--retention", "-1h", "--database-url="+url)
	unmigrated := dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true})
	require.Contains(t, fails(t, 1, "sweeper", "--once", "--database-url="+unmigrated),
		`onceflow: onceflow's tables are missing or older than this build in schema "public": run `+"`onceflow migrate up`",
		"the sweeper checks the schema before it starts")
	fails(t, 2, "sweeper", "--once", "--prune-every", "sometimes", "--database-url="+url)
}

// TestSweeperServesAndStopsOnSignal: the long-running sweeper serves
// metrics and health, and SIGTERM stops it with exit code 0.
func TestSweeperServesAndStopsOnSignal(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	cmd := exec.Command(binary, "sweeper", "--metrics-addr", "127.0.0.1:0", "--report-every", "@every 1s", "--database-url="+url)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	addrs := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			line := lines.Text()
			if _, after, found := strings.Cut(line, `msg="serving metrics and health" addr=`); found {
				addrs <- after
			}
		}
	}()
	var addr string
	select {
	case addr = <-addrs:
	case <-time.After(30 * time.Second):
		t.Fatal("the sweeper did not say where it serves")
	}

	health := get(t, "http://"+addr+"/healthz")
	require.JSONEq(t, `{"status":"ok"}`, health)
	require.Eventually(t, func() bool {
		return strings.Contains(get(t, "http://"+addr+"/metrics"), `onceflow_sweeper_task_runs_total{result="ok",task="completer"}`)
	}, 10*time.Second, 100*time.Millisecond, "the report task runs on its schedule")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "a graceful stop exits 0")
	case <-time.After(20 * time.Second):
		t.Fatal("the sweeper did not stop on SIGTERM")
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

func TestHelpAndErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--help"}, {"migrate", "--help"}, {"migrate", "up", "--help"}, {"migrate", "down", "--help"},
		{"migrate", "status", "--help"}, {"sweeper", "--help"}, {"keys", "--help"}, {"keys", "list", "--help"},
		{"keys", "show", "--help"}, {"keys", "release", "--help"}, {"keys", "fail", "--help"}, {"keys", "resume", "--help"},
		{"workflows", "--help"}, {"workflows", "export", "--help"}, {"workflows", "diff", "--help"},
		{"outbox", "--help"}, {"outbox", "list", "--help"}, {"outbox", "retry", "--help"}, {"outbox", "dead", "--help"},
	} {
		out := ok(t, args...)
		require.Contains(t, out, "Usage:", "%v", args)
	}
	require.Contains(t, fails(t, 2, "keys", "list"), "no database: pass --database-url or set ONCEFLOW_DATABASE_URL")
	// DATABASE_URL may name a developer's own application database: never used.
	generic := exec.Command(binary, "keys", "list")
	generic.Env = append(os.Environ(), "ONCEFLOW_DATABASE_URL=", "DATABASE_URL=postgres://app@127.0.0.1:1/app")
	out, err := generic.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "no database: pass --database-url or set ONCEFLOW_DATABASE_URL")
	fails(t, 2, "frobnicate")
	fails(t, 2, "outbox", "retyr", "1")
	fails(t, 2, "migrate", "upp")
	require.Contains(t, fails(t, 2, "keys"), "needs a subcommand")
	require.Contains(t, fails(t, 2, "workflows"), "needs a subcommand")
	fails(t, 2, "keys", "list", "--limit", "-3", "--database-url=postgres://x@127.0.0.1:1/db")
	fails(t, 2, "keys", "show", "only-one-arg", "--database-url=postgres://x@127.0.0.1:1/db")
	require.Contains(t, fails(t, 1, "keys", "list", "--database-url=postgres://x@127.0.0.1:1/db"), "connect to the database")
}

// TestUnmigratedDatabaseIsOneSentence: every command that reads onceflow's
// tables says, on a database without them, which command creates them,
// never a bare SQLSTATE.
func TestUnmigratedDatabaseIsOneSentence(t *testing.T) {
	unmigrated := dbtest.NewDatabase(t, dbtest.Options{Unmigrated: true})
	for _, args := range [][]string{
		{"keys", "list"},
		{"keys", "show", "acme", "k1"},
		{"outbox", "list"},
		{"outbox", "dead"},
		{"outbox", "retry", "1"},
	} {
		stderr := fails(t, 1, append(args, "--database-url="+unmigrated)...)
		require.Contains(t, stderr, "run `onceflow migrate up`", "onceflow %v", args)
	}
}
