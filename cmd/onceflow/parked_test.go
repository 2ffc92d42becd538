package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// versioned is a database with the checkout as version 1 (create_order,
// charge, record_charge) and as version 2, which inserts fraud_check
// before charge: a record version 1 left after create_order is parked by
// version 2. Both count the steps they run.
type versioned struct {
	t      *testing.T
	ctx    context.Context
	url    string
	db     string // the --database-url flag
	store  *recovery.Store
	v1, v2 *workflow.Workflow[int, int]

	mu   sync.Mutex
	runs map[string]int // "version/step" -> runs
}

func newVersioned(t *testing.T) *versioned {
	t.Helper()
	url := dbtest.NewDatabase(t, dbtest.Options{})
	pool := dbtest.Connect(t, url, 4)
	store, err := recovery.New(pool, recovery.Config{})
	require.NoError(t, err)
	v := &versioned{t: t, ctx: context.Background(), url: url, db: "--database-url=" + url, store: store, runs: map[string]int{}}
	v.v1 = v.define("1", "create_order:A", "charge:F", "record_charge:A")
	v.v2 = v.define("2", "create_order:A", "fraud_check:A", "charge:F", "record_charge:A")
	return v
}

// define makes a version of the checkout from steps written "name:A"
// (atomic) or "name:F" (foreign).
func (v *versioned) define(version string, steps ...string) *workflow.Workflow[int, int] {
	var ps []phase.Step[int, int]
	for _, s := range steps {
		name, kind, _ := strings.Cut(s, ":")
		count := func(step string) {
			v.mu.Lock()
			defer v.mu.Unlock()
			v.runs[version+"/"+step]++
		}
		if kind == "A" {
			ps = append(ps, phase.Atomic(name, func(_ context.Context, _ pgx.Tx, r *phase.Run[int, int]) error {
				count(r.Step)
				return nil
			}))
		} else {
			ps = append(ps, phase.Foreign(name, func(_ context.Context, r *phase.Run[int, int]) error {
				count(r.Step)
				return nil
			}))
		}
	}
	return workflow.Define("checkout", ps...).Version(version)
}

func (v *versioned) ran() map[string]int {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := map[string]int{}
	for k, n := range v.runs {
		out[k] = n
	}
	return out
}

// engine is an engine over the database registering defs.
func (v *versioned) engine(defs ...workflow.Definition) *workflow.Engine {
	v.t.Helper()
	e, err := workflow.NewEngine(dbtest.Connect(v.t, v.url, 4), workflow.Config{Workflows: defs})
	require.NoError(v.t, err)
	return e
}

// park runs version 1 for tenant acme's key id until it dies right after
// create_order committed, then lets version 2 take it over: it parks.
func (v *versioned) park(id string) {
	v.t.Helper()
	crashing, err := workflow.NewEngine(dbtest.Connect(v.t, v.url, 2), workflow.Config{Hooks: &workflow.Hooks{
		CrashPoint: func(_ context.Context, _ workflow.Key, p workflow.CrashPoint) error {
			if p == (workflow.CrashPoint{Kind: workflow.AfterCommit, Step: "create_order"}) {
				return errors.New("died")
			}
			return nil
		},
	}})
	require.NoError(v.t, err)
	key := workflow.Key{Tenant: "acme", ID: id}
	_, err = v.v1.Run(v.ctx, crashing, key, 1)
	require.ErrorIs(v.t, err, workflow.ErrCrashed)
	expireLease(v.t, v.url, id)
	_, err = v.engine(v.v2).Resume(v.ctx, key)
	require.ErrorIs(v.t, err, workflow.ErrParked)
	require.Equal(v.t, recovery.StatusParked, v.load(id).Status)
}

func (v *versioned) load(id string) *recovery.Record {
	v.t.Helper()
	rec, err := v.store.Load(v.ctx, recovery.Key{Tenant: "acme", ID: id})
	require.NoError(v.t, err)
	return rec
}

// TestKeysShowParked: keys list --status parked lists parked keys with
// why; keys show names the version that wrote the key and why it is
// parked.
func TestKeysShowParked(t *testing.T) {
	t.Parallel()
	v := newVersioned(t)
	v.park("order-1")
	_, err := v.v1.Run(v.ctx, v.engine(v.v1), workflow.Key{Tenant: "acme", ID: "order-2"}, 2)
	require.NoError(t, err)

	table := ok(t, "keys", "list", "--status", "parked", v.db)
	require.Equal(t, 2, strings.Count(table, "\n"), "the header and the parked key: %s", table)
	require.Contains(t, table, "order-1")
	require.Contains(t, table, "parked")
	var listed []struct {
		Key, Status string
		LastError   string `json:"last_error"`
		Definition  struct{ Fingerprint, Version string }
	}
	require.NoError(t, json.Unmarshal([]byte(ok(t, "keys", "list", "--status", "parked", "--json", v.db)), &listed))
	require.Len(t, listed, 1)
	require.Equal(t, "order-1", listed[0].Key)
	require.Equal(t, "parked", listed[0].Status)
	require.Contains(t, listed[0].LastError, "written by version 1, running version 2")
	require.Equal(t, v.v1.Spec().Fingerprint, listed[0].Definition.Fingerprint)
	require.Equal(t, "1", listed[0].Definition.Version)

	shown := ok(t, "keys", "show", "acme", "order-1", v.db)
	require.Regexp(t, `(?m)^definition\s+1 \(fingerprint `+v.v1.Spec().Fingerprint+`\)$`, shown)
	require.Regexp(t, `(?m)^parked because\s+written by version 1, running version 2: `, shown)
	require.Regexp(t, `(?m)^lease\s+none \(parked\)$`, shown)
	require.Regexp(t, `(?m)^status\s+parked$`, shown)
	require.NotContains(t, shown, "resume as")
}

// TestKeysResume: keys resume --as puts a parked key back in flight under
// the stored version it names, fenced by the owner token it read; the next
// process that registers that version runs it from its recovery point. It
// refuses a key that is not parked, a version that is not stored, and one
// that lacks the key's recovery point, and writes nothing then.
func TestKeysResume(t *testing.T) {
	t.Parallel()
	v := newVersioned(t)
	v.park("order-1")
	v.park("order-2")
	// A third version, stored, without create_order.
	require.NoError(t, v.engine(v.define("3", "make_order:A", "charge:F")).SaveDefinitions(v.ctx))
	before := v.load("order-1")

	require.Contains(t, fails(t, 1, "keys", "resume", "acme", "order-1", "--as", "9", v.db),
		`workflow checkout has no stored version "9" (stored: 1, 2, 3)`)
	require.Contains(t, fails(t, 1, "keys", "resume", "acme", "order-1", "--as", "3", v.db),
		`its recovery point "create_order" is not a step of version 3 of checkout (steps: make_order, charge)`)
	require.Contains(t, fails(t, 2, "keys", "resume", "acme", "order-1", v.db), `required flag(s) "as" not set`)
	require.Contains(t, fails(t, 1, "keys", "resume", "acme", "nope", "--as", "2", v.db), "not found")
	require.Equal(t, before.UpdatedAt, v.load("order-1").UpdatedAt, "nothing was written")

	fp2 := v.v2.Spec().Fingerprint
	require.Equal(t, `resumed key "order-1" of tenant "acme" as version 2 of checkout (fingerprint `+fp2+`), after its recovery point create_order
the next claim of the key, or the completer, runs it under version 2: the processes that run checkout must register it, or they park the key again
`, ok(t, "keys", "resume", "acme", "order-1", "--as", "2", v.db))
	rec := v.load("order-1")
	require.Equal(t, recovery.StatusInFlight, rec.Status)
	require.True(t, rec.Released, "any claim takes it over at once")
	require.Equal(t, fp2, rec.ResumeAs)
	require.Equal(t, v.v1.Spec().Fingerprint, rec.Definition, "the definition that wrote it is kept")
	require.NotEqual(t, before.Owner, rec.Owner, "the owner token read is retired")
	require.Contains(t, fails(t, 1, "keys", "resume", "acme", "order-1", "--as", "2", v.db),
		`key "order-1" of tenant "acme" is in_flight, not parked`)
	require.Regexp(t, `(?m)^resume as\s+2 \(fingerprint `+fp2+`\)$`, ok(t, "keys", "show", "acme", "order-1", v.db))

	res, err := v.engine(v.v2).Resume(v.ctx, workflow.Key{Tenant: "acme", ID: "order-1"})
	require.NoError(t, err)
	require.Equal(t, "create_order", res.ResumedFrom)
	require.Equal(t, recovery.StatusCompleted, v.load("order-1").Status)
	require.Equal(t, map[string]int{"1/create_order": 2, "2/fraud_check": 1, "2/charge": 1, "2/record_charge": 1}, v.ran(),
		"version 2 ran the steps after create_order, which version 1 ran once for each key")

	// By full fingerprint.
	require.Contains(t, ok(t, "keys", "resume", "acme", "order-2", "--as", fp2, v.db), "as version 2 of checkout")
	require.Equal(t, fp2, v.load("order-2").ResumeAs)
}

// TestKeysResumeIsFenced: keys resume writes only if the key is still
// parked under the owner token it read. The test holds the record's row
// lock so that the command reads the record (a read takes no lock) and
// waits at its write; meanwhile another operator releases the key and it
// is parked again, under a new owner token. The command's write must then
// find nothing to change.
func TestKeysResumeIsFenced(t *testing.T) {
	t.Parallel()
	v := newVersioned(t)
	v.park("order-1")
	pool := dbtest.Connect(t, v.url, 2)
	before := v.load("order-1")
	tx, err := pool.Begin(v.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(v.ctx) }() // after a failure; a no-op after the commit
	_, err = tx.Exec(v.ctx, `SELECT 1 FROM onceflow_keys WHERE tenant_id = 'acme' AND key = 'order-1' FOR UPDATE`)
	require.NoError(t, err)
	done := make(chan result, 1)
	go func() { done <- onceflow(t, "keys", "resume", "acme", "order-1", "--as", "2", v.db) }()
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(v.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()
			AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' AND query LIKE '%onceflow_keys%')`).Scan(&waiting)
		return err == nil && waiting
	}, time.Minute, 5*time.Millisecond, "resume never reached its write")
	// Another operator's release, and a process that parked it again.
	_, err = tx.Exec(v.ctx, `UPDATE onceflow_keys SET owner = gen_random_uuid(), last_error = 'parked again'
		WHERE tenant_id = 'acme' AND key = 'order-1'`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(v.ctx))

	r := <-done
	require.Equal(t, 1, r.code, "%s%s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, "the key changed while this command ran")
	after := v.load("order-1")
	require.Equal(t, recovery.StatusParked, after.Status)
	require.Empty(t, after.ResumeAs)
	require.NotEqual(t, before.Owner, after.Owner)
}

// TestKeysReleaseAndFailParked: release and fail act on a parked key,
// with or without --force (a parked key holds no lease, so the operator's
// fence applies either way): release puts it back in flight, released, and
// the next claim applies the rules again; fail stores a 500.
func TestKeysReleaseAndFailParked(t *testing.T) {
	t.Parallel()
	v := newVersioned(t)
	for _, id := range []string{"r1", "r2", "f1", "f2"} {
		v.park(id)
	}
	for _, args := range [][]string{{"keys", "release", "acme", "r1"}, {"keys", "release", "acme", "r2", "--force"}} {
		require.Equal(t, `released key "`+args[3]+`" of tenant "acme"`+"\n", ok(t, append(args, "--reason", "deployed Versions", v.db)...))
		rec := v.load(args[3])
		require.Equal(t, recovery.StatusInFlight, rec.Status, "%v", args)
		require.True(t, rec.Released, "%v", args)
		require.Equal(t, 2, rec.Attempts, "%v", args)
		require.Equal(t, "released by an operator: deployed Versions", rec.LastError, "%v", args)
	}
	// With both versions registered, version 1 finishes what it started.
	res, err := v.engine(workflow.Versions(v.v1, v.v2)).Resume(v.ctx, workflow.Key{Tenant: "acme", ID: "r1"})
	require.NoError(t, err)
	require.Equal(t, "create_order", res.ResumedFrom)
	require.Equal(t, recovery.StatusCompleted, v.load("r1").Status)

	for _, args := range [][]string{{"keys", "fail", "acme", "f1"}, {"keys", "fail", "acme", "f2", "--force"}} {
		require.Equal(t, `failed key "`+args[3]+`" of tenant "acme"`+"\n"+
			"the steps committed up to create_order stay committed: nothing was undone\n", ok(t, append(args, v.db)...))
		rec := v.load(args[3])
		require.Equal(t, recovery.StatusFailed, rec.Status, "%v", args)
		require.Equal(t, 500, rec.Response.Status, "%v", args)
	}
}

// TestWorkflowsExportAndDiff: workflows export writes the definitions the
// database stores as JSON; workflows diff says which recovery points of
// the previous ones the current ones would park, and exits 3 when any
// would, 0 when none would, 1 when a file is not an export. It reads
// pipes, as <(onceflow workflows export) makes.
func TestWorkflowsExportAndDiff(t *testing.T) {
	t.Parallel()
	v := newVersioned(t)
	other := workflow.Define("refund", phase.Atomic("refund", func(context.Context, pgx.Tx, *phase.Run[int, int]) error { return nil }))
	_, err := v.v1.Run(v.ctx, v.engine(v.v1, other), workflow.Key{Tenant: "acme", ID: "done"}, 1)
	require.NoError(t, err)
	require.NoError(t, v.engine(other).SaveDefinitions(v.ctx))

	// Every record finished: no definition is needed by one in flight.
	require.Equal(t, "[]\n", ok(t, "workflows", "export", v.db))
	var specs []workflow.Spec
	require.NoError(t, json.Unmarshal([]byte(ok(t, "workflows", "export", "--all", v.db)), &specs))
	require.Equal(t, []workflow.Spec{v.v1.Spec(), other.Spec()}, specs)
	require.Equal(t, "[]\n", ok(t, "workflows", "export", "--all", "--workflow", "nope", v.db))
	// A record in flight under version 1 (and a finished one under
	// "refund") exports version 1 alone.
	fp, canonical, err := recovery.FingerprintJSON("checkout", []byte("2"))
	require.NoError(t, err)
	_, _, err = v.store.Claim(v.ctx, recovery.ClaimParams{Key: workflow.Key{Tenant: "acme", ID: "in-flight"}, Workflow: "checkout",
		Fingerprint: fp, Request: canonical, Definition: v.v1.Spec().Fingerprint})
	require.NoError(t, err)
	exported := ok(t, "workflows", "export", v.db)
	require.NoError(t, json.Unmarshal([]byte(exported), &specs))
	require.Equal(t, []workflow.Spec{v.v1.Spec()}, specs)
	require.Equal(t, exported, ok(t, "workflows", "export", "--workflow", "checkout", v.db))

	dir := t.TempDir()
	file := func(name string, specs ...workflow.Spec) string {
		t.Helper()
		body, err := json.Marshal(specs)
		require.NoError(t, err)
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, body, 0o600))
		return path
	}
	prev := filepath.Join(dir, "prev.json")
	require.NoError(t, os.WriteFile(prev, []byte(exported), 0o600))

	require.Equal(t, "nothing would park: every in-flight record of the previous definitions resumes under the current ones\n",
		ok(t, "workflows", "diff", prev, prev))
	after := v.define("1.1", "create_order:A", "charge:F", "record_charge:A", "send_receipt:F")
	require.Contains(t, ok(t, "workflows", "diff", prev, file("after.json", after.Spec())), "nothing would park")
	require.Contains(t, ok(t, "workflows", "diff", prev, file("both.json", v.v1.Spec(), v.v2.Spec())), "nothing would park",
		"version 1 kept registered finishes its records")

	unsafe := file("unsafe.json", v.v2.Spec())
	r := onceflow(t, "workflows", "diff", prev, unsafe)
	require.Equal(t, 3, r.code, "%s%s", r.stdout, r.stderr)
	require.Equal(t, "checkout 1 after create_order: step 2 is charge (foreign) in version 1, which may have started, but fraud_check (atomic) in version 2\n"+
		"checkout 1 after charge: step 2 is charge (foreign) in version 1, which completed, but fraud_check (atomic) in version 2\n", r.stdout)
	require.Equal(t, "onceflow: records would park at 2 recovery points: in-flight records there would wait for an operator after this deploy\n", r.stderr)
	var findings []workflow.Finding
	r = onceflow(t, "workflows", "diff", "--json", prev, unsafe)
	require.Equal(t, 3, r.code)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &findings))
	require.Equal(t, workflow.Diff([]workflow.Spec{v.v1.Spec()}, []workflow.Spec{v.v2.Spec()}), findings)
	require.Equal(t, "[]\n", ok(t, "workflows", "diff", "--json", prev, prev))

	// From a pipe, as <(...) gives it.
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	cmd := exec.Command(binary, "workflows", "diff", "/dev/fd/3", unsafe)
	cmd.ExtraFiles = []*os.File{pr}
	require.NoError(t, cmd.Start())
	pr.Close()
	_, err = pw.WriteString(exported)
	require.NoError(t, err)
	pw.Close()
	var exit *exec.ExitError
	require.ErrorAs(t, cmd.Wait(), &exit)
	require.Equal(t, 3, exit.ExitCode())

	require.Contains(t, fails(t, 1, "workflows", "diff", prev, filepath.Join(dir, "missing.json")), "no such file")
	keys := filepath.Join(dir, "keys.json")
	require.NoError(t, os.WriteFile(keys, []byte(ok(t, "keys", "list", "--json", v.db)), 0o600))
	require.Contains(t, fails(t, 1, "workflows", "diff", prev, keys), "definition 1 has no workflow, fingerprint, version or steps")
	fails(t, 2, "workflows", "diff", prev)
}

// TestSweeperOnceReportsParked: the command-line sweeper reports parked
// keys, and its pruner keeps them.
func TestSweeperOnceReportsParked(t *testing.T) {
	t.Parallel()
	v := newVersioned(t)
	v.park("order-1")
	r := onceflow(t, "sweeper", "--once", v.db)
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "parked (see onceflow keys list --status parked): 1 checkout\n")
	require.Contains(t, r.stderr, `level=WARN msg="parked records wait for an operator: onceflow keys list --status parked" workflow=checkout records=1`)
	require.Equal(t, recovery.StatusParked, v.load("order-1").Status)
}

// TestWorkflowsDiffComparesWhatIsUndone: workflows diff fails a deploy that
// moves the point of no return past records in flight that had passed it
// (they would be undone); definitions exported by a build that did not
// record what they undo are compared by their steps, with a note.
func TestWorkflowsDiffComparesWhatIsUndone(t *testing.T) {
	t.Parallel()
	noop := func(context.Context, pgx.Tx, *phase.Run[int, int]) error { return nil }
	call := func(context.Context, *phase.Run[int, int]) error { return nil }
	define := func(version, noReturn string) workflow.Spec {
		return workflow.Define("checkout", phase.Atomic("create_order", noop), phase.Foreign("charge", call).Compensate(call),
			phase.Atomic("record_charge", noop), phase.Atomic("ship", noop)).Version(version).PointOfNoReturn(noReturn).Spec()
	}
	dir := t.TempDir()
	file := func(name string, specs ...workflow.Spec) string {
		t.Helper()
		body, err := json.Marshal(specs)
		require.NoError(t, err)
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, body, 0o600))
		return path
	}
	v1 := define("1", "record_charge")
	cur := file("cur.json", define("2", "ship"))
	r := onceflow(t, "workflows", "diff", file("prev.json", v1), cur)
	require.Equal(t, 3, r.code, "%s%s", r.stdout, r.stderr)
	require.Equal(t, "checkout 1 after record_charge: the record is past the point of no return of version 1 (its point of no return is after record_charge), "+
		"so nothing it did may be undone, but version 2 would undo step charge (its point of no return is after ship)\n", r.stdout)
	require.NotContains(t, r.stderr, "note:")

	legacy := v1
	legacy.Fingerprint, legacy.State, legacy.Earlier, legacy.Compensation = v1.Earlier.Fingerprint, v1.Earlier.State, nil, nil
	r = onceflow(t, "workflows", "diff", file("legacy.json", legacy), cur)
	require.Zero(t, r.code, "%s%s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, "legacy.json holds definitions from a build that did not record what they undo")
}

// TestKeysResumeTakesTheDefinitionOverItsLegacyOne: a version stored by a
// build from before definitions recorded what they undo, and again by this
// one under its new fingerprint, is one definition: keys resume --as takes
// its label for the new one instead of asking for a fingerprint.
func TestKeysResumeTakesTheDefinitionOverItsLegacyOne(t *testing.T) {
	t.Parallel()
	v := newVersioned(t)
	v.park("order-1")
	sp := v.v2.Spec()
	legacy := sp
	legacy.Fingerprint, legacy.State, legacy.Earlier, legacy.Compensation = sp.Earlier.Fingerprint, sp.Earlier.State, nil, nil
	body, err := json.Marshal(legacy)
	require.NoError(t, err)
	pool := dbtest.Connect(t, v.url, 1)
	_, err = pool.Exec(v.ctx, `INSERT INTO onceflow_definitions (workflow, fingerprint, version, spec) VALUES ($1, $2, $3, $4)`,
		sp.Workflow, legacy.Fingerprint, sp.Version, string(body))
	require.NoError(t, err)

	require.Contains(t, ok(t, "keys", "resume", "acme", "order-1", "--as", "2", v.db), "(fingerprint "+sp.Fingerprint+")")
	require.Equal(t, sp.Fingerprint, v.load("order-1").ResumeAs)
}
