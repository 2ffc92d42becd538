package workflow

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/lease"
	"github.com/onceflow/onceflow/internal/opentx"
	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/internal/sleep"
	"github.com/onceflow/onceflow/internal/tracing"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
)

// cleanupTimeout bounds the writes an attempt makes after its context ended
// (releasing the lease, deleting a rejected claim).
const cleanupTimeout = 10 * time.Second

// beginSQL opens the engine's transactions: the claim re-runs its statement
// after losing a race, which needs a fresh snapshot per statement, whatever
// the server's default isolation.
const beginSQL = "begin isolation level read committed"

// attempt is one run of a workflow under a key: from the claim to the
// response or the error.
type attempt[Req, State any] struct {
	e     *Engine
	w     *Workflow[Req, State]
	key   Key
	claim func(ctx context.Context, s *recovery.Store) (*recovery.Record, recovery.Outcome, error)
	// pipelined, when set, opens the transaction, marks it with mark
	// (opentx) and claims in one round trip on conn, after ending the
	// transaction a replay left open there when rollback is set.
	pipelined func(ctx context.Context, conn *pgxpool.Conn, rollback bool, mark string) (*recovery.Record, recovery.Outcome, error)
	start     int // the step expected to run first; the claim folds into it when atomic
	// fromRecord: the request comes from the record the claim returns
	// (Resume), not from the caller.
	fromRecord bool
	hops       int // how often the record was handed to another version

	conn      *workConn  // the connection the open transaction is on
	tx        *opentx.Tx // the open transaction, if any
	rec       *recovery.Record
	outcome   recovery.Outcome
	claimSent time.Time              // when the claim was sent, once it had a connection
	keeper    *lease.Keeper          // keeps the lease from the claim on
	heldStep  atomic.Pointer[string] // the step the keeper holds the lease for
	run       phase.Run[Req, State]
	next      int  // index of the next step to run
	placed    bool // next is set: the claim found where the record is
	first     int  // the step after the recovery point the claim found
	loaded    bool // the record's request and state are read into run
	// claimed is the record as the claim found it, as stored (a.rec has
	// the recovery point in this definition's names once loaded).
	claimed claimMark
	// restamped is what loadState stamped the record with in the claim's
	// uncommitted transaction: a rollback takes it back with the claim,
	// and the claim made again after it (recordAfterRollback) makes it
	// again, so that the state this attempt writes is never stored under
	// the definition that wrote the state it replaces.
	restamped *restamp
	// retriedStep is the last step whose call this attempt tried again
	// (foreign.Retry): an earlier try of it may have reached the other
	// system.
	retriedStep string
	claimOpen   bool // the claim is uncommitted, in the open transaction
	committed   bool // a recovery point exists
	// acted: this attempt did something a rollback cannot undo (started a
	// foreign call, or committed a step).
	acted bool
	span  trace.Span // the attempt's span (trace.go)
}

// lostLease marks a loss of the lease that the engine itself found (a
// fenced write that matched no row, a heartbeat that found the key taken
// over), as opposed to a step's own error that happens to wrap
// ErrLeaseLost.
type lostLease struct{ err error }

func (l *lostLease) Error() string { return l.err.Error() }
func (l *lostLease) Unwrap() error { return l.err }

// fenced marks err as a lost lease when a fenced write reports one.
func fenced(err error) error {
	if errors.Is(err, ErrLeaseLost) {
		return &lostLease{err}
	}
	return err
}

// run starts or continues the workflow for a client's request.
func (w *Workflow[Req, State]) run(ctx context.Context, e *Engine, key Key, req Req, opts runOptions) (*Result, error) {
	body, fp, err := w.encodeRequest(req)
	if err != nil {
		return nil, err
	}
	if err := e.ensureSaved(ctx, w); err != nil {
		return nil, fmt.Errorf("workflow %s: %w", w.name, err)
	}
	params := recovery.ClaimParams{Key: key, Workflow: w.name, Fingerprint: fp, Request: body, Principal: opts.principal,
		Definition: w.spec().Fingerprint}
	a := &attempt[Req, State]{e: e, w: w, key: key}
	// A record the claim creates stores the attempt's trace context, which
	// is known once the attempt's span has started.
	traced := func() recovery.ClaimParams {
		p := params
		p.TraceParent = a.traceParent()
		return p
	}
	a.claim = func(ctx context.Context, s *recovery.Store) (*recovery.Record, recovery.Outcome, error) {
		return s.Claim(ctx, traced())
	}
	a.pipelined = func(ctx context.Context, conn *pgxpool.Conn, rollback bool, mark string) (*recovery.Record, recovery.Outcome, error) {
		begin := []string{beginSQL}
		if rollback {
			begin = []string{"rollback", beginSQL}
		}
		return seam.StoreOf(e.store).BeginAndClaim(ctx, conn, begin, mark, traced())
	}
	a.run.Request = req
	return a.execute(ctx)
}

// encodeRequest returns the JSON of req to store with a new record, as
// encoding/json writes it, and its fingerprint, which is over its canonical
// form (recovery.FingerprintJSON). The canonical form is not what is
// stored: it writes an integer of more than 21 digits with an exponent,
// which a *big.Int does not read. A request whose JSON does not decode
// back into Req (a type whose MarshalJSON its UnmarshalJSON cannot read)
// is refused with ErrInvalidInput: no resume could read it.
func (w *Workflow[Req, State]) encodeRequest(req Req) ([]byte, recovery.Fingerprint, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, recovery.Fingerprint{}, fmt.Errorf("%w: encode %s request: %v", ErrInvalidInput, w.name, err)
	}
	fp, _, err := recovery.FingerprintJSON(w.name, body)
	if err != nil {
		return nil, recovery.Fingerprint{}, fmt.Errorf("%w: %v", ErrInvalidInput, err)
	}
	var back Req
	if err := json.Unmarshal(body, &back); err != nil {
		return nil, recovery.Fingerprint{}, fmt.Errorf("%w: the %s request's JSON does not decode back into its type, so a resume could not read it: %v",
			ErrInvalidInput, w.name, err)
	}
	return body, fp, nil
}

// resume continues the workflow of rec from its stored request. It stores
// w's definition first, as run does: the attempt may stamp the record with
// it (or park the record under it), and a later process, or an operator's
// onceflow keys resume --as, must find it.
func (w *Workflow[Req, State]) resume(ctx context.Context, e *Engine, rec *recovery.Record, hops int) (*Result, error) {
	if err := e.ensureSaved(ctx, w); err != nil {
		return nil, fmt.Errorf("workflow %s: %w", w.name, err)
	}
	a := &attempt[Req, State]{e: e, w: w, key: rec.Key, fromRecord: true, hops: hops,
		claim: func(ctx context.Context, s *recovery.Store) (*recovery.Record, recovery.Outcome, error) {
			return seam.StoreOf(s).Takeover(ctx, rec.Key, w.name)
		},
	}
	a.start, _ = w.indexAfter(rec.RecoveryPoint)
	return a.execute(ctx)
}

// execute claims the key and runs the steps after its recovery point. A
// panic outside the steps' own functions (in a state's JSON methods, say)
// rolls back and is handled as a failed step.
func (a *attempt[Req, State]) execute(ctx context.Context) (res *Result, err error) {
	ctx = a.startAttempt(ctx)
	defer func() { a.endAttempt(res, err) }() // last: after the recovery below
	defer func() {
		if v := recover(); v != nil {
			res, err = a.failed(ctx, "", &phase.PanicError{Step: a.run.Step, Value: v, Stack: debug.Stack()})
		}
	}()
	steps := a.w.steps
	folded := a.start < len(steps) && steps[a.start].Kind() == phase.KindAtomic
	if folded {
		if err := a.e.crashPoint(ctx, a.key, BeforeStep, steps[a.start].Name()); err != nil {
			return nil, err
		}
	}
	if res, err := a.claimKey(ctx, folded); res != nil || err != nil {
		return res, err
	}
	a.keepLease(ctx, a.claimSent)
	if a.tx != nil && (a.next != a.start || a.rec.Compensating()) {
		// The record moved on since the guess: commit the takeover alone.
		if err := a.commit(ctx); err != nil {
			return a.failed(ctx, "", err)
		}
	}
	spent := a.outcome == recovery.OutcomeTakeover && a.e.maxAttempts > 0 && a.rec.Attempts >= a.e.maxAttempts
	if a.rec.Compensating() {
		if spent {
			return a.compensationFailedForGood(ctx, a.rec.Undo[0], errors.New(a.rec.LastError))
		}
		return a.compensate(ctx)
	}
	if spent {
		return a.giveUp(ctx, "", a.rec, a.rec.Attempts, errors.New(a.rec.LastError), nil)
	}
	for a.next < len(steps) {
		step := steps[a.next]
		a.run.KeyStep = a.w.keyStep(a.next)
		if a.tx == nil {
			if err := a.e.crashPoint(ctx, a.key, BeforeStep, step.Name()); err != nil {
				return nil, err
			}
		}
		if res, err := a.runStep(ctx, step); res != nil || err != nil {
			return res, err
		}
	}
	// Every step is committed but no response is stored (the workflow was
	// redefined with fewer steps): finish from the state.
	return a.respond(ctx, a.w.steps[len(steps)-1].Name(), nil)
}

// claimKey claims the key, in a new transaction when folded, and loads the
// record. It returns a result or an error when this attempt does not own
// the key.
func (a *attempt[Req, State]) claimKey(ctx context.Context, folded bool) (*Result, error) {
	claimCtx, span := a.startClaim(ctx)
	rec, outcome, err := a.claimWith(claimCtx, folded)
	a.endClaim(span, rec, outcome, err)
	a.e.observeClaim(a.w.name, outcome, err)
	if err != nil || outcome == recovery.OutcomeReplay {
		if outcome == recovery.OutcomeReplay && a.conn != nil {
			// The claim wrote nothing: its transaction is ended off
			// the caller's path, by the next claim (keptConn), and the
			// answer goes now.
			a.e.kept.keep(a.conn)
			a.conn, a.tx, a.claimOpen = nil, nil, false
		}
		a.rollback()
		if err != nil {
			return nil, fmt.Errorf("workflow %s: %w", a.w.name, err)
		}
		return replayed(rec), nil
	}
	a.rec, a.outcome, a.claimed = rec, outcome, markOf(rec)
	a.run.Key, a.run.RecordID, a.run.Attempt, a.run.Lease = a.key, rec.ID, rec.Attempts+1, a.e.lease
	a.run.KeysFromClientKey = a.e.keysFromKey
	a.run.Retried = func(step string, try int, err error, wait time.Duration) { a.retried(ctx, step, try, err, wait) }
	a.run.Pacer = a.e.pacer
	a.committed = rec.RecoveryPoint != ""
	if a.fromRecord {
		// What was taken over may not be what Resume loaded a moment ago.
		if rec.Workflow != a.w.name {
			return a.failed(ctx, "", fmt.Errorf("%w: the record now belongs to workflow %s", ErrUnknownWorkflow, rec.Workflow))
		}
	}
	r, err := a.e.route(ctx, a.store(), a.w, rec)
	switch {
	case err != nil:
		return a.failed(ctx, "", err)
	case r.park != "":
		return a.park(ctx, r.park)
	case r.other != nil:
		return a.handOver(ctx, r.other)
	}
	next, ok := a.w.indexAfter(r.point)
	if !ok {
		// A record claimed before definitions were stored, or resumed by
		// an operator's choice: no attempt of this definition can run it.
		return a.park(ctx, fmt.Sprintf("its recovery point %q is not a step of version %s", r.point, a.w.spec().Version))
	}
	a.next, a.first, a.placed = next, next, true
	if err := a.loadRecord(ctx, rec, r); err != nil {
		var unreadable *unreadableError
		if errors.As(err, &unreadable) {
			return a.park(ctx, err.Error())
		}
		return a.failed(ctx, "", err)
	}
	a.loaded = true
	if outcome == recovery.OutcomeTakeover {
		a.e.logger.InfoContext(ctx, "resuming workflow", a.logAttrs("", slog.String("after", rec.RecoveryPoint))...)
	}
	return nil, nil
}

// loadRecord reads the record into the attempt: its stored request, when
// the attempt resumes it (a caller's run has the request it was given), and
// its state (loadState). What this definition cannot decode is an
// *unreadableError.
func (a *attempt[Req, State]) loadRecord(ctx context.Context, rec *recovery.Record, r route) error {
	if a.fromRecord {
		if err := json.Unmarshal(rec.Request, &a.run.Request); err != nil {
			return &unreadableError{what: "request", version: a.w.spec().Version, err: err}
		}
	}
	return a.loadState(ctx, rec, r)
}

// loadState decodes the record's state, through the definition's state
// upgrader when another definition wrote it, and, when the record was
// written by another definition (or before definitions were stored, or an
// operator chose this one), records that this one now runs it: its
// fingerprint, the recovery point in its names, and the upgraded state.
func (a *attempt[Req, State]) loadState(ctx context.Context, rec *recovery.Record, r route) error {
	upgraded := false
	switch {
	case len(rec.State) == 0:
	case r.upgrade && a.w.upgradeState != nil:
		state, err := a.w.upgradeState(rec.State)
		if err != nil {
			return &unreadableError{what: "state", writer: rec.Definition, version: a.w.spec().Version, err: err}
		}
		a.run.State, upgraded = state, true
	default:
		if err := json.Unmarshal(rec.State, &a.run.State); err != nil {
			return &unreadableError{what: "state", writer: rec.Definition, version: a.w.spec().Version, err: err}
		}
	}
	if !r.upgrade && !r.restamp && rec.Definition != "" && rec.ResumeAs == "" {
		return nil
	}
	var state []byte
	if upgraded {
		var err error
		if state, err = json.Marshal(a.run.State); err != nil {
			return fmt.Errorf("encode upgraded state: %w", err)
		}
	}
	sp := a.w.spec()
	if err := seam.StoreOf(a.store()).Restamp(ctx, a.rec.Fence(), sp.Fingerprint, r.point, state); err != nil {
		return fenced(err)
	}
	if a.claimOpen {
		a.restamped = &restamp{point: r.point, state: state}
	}
	a.rec.RecoveryPoint = r.point // in this definition's names, for ResumedFrom and the log
	if r.upgrade {
		from := rec.Definition
		if r.from != nil {
			from = r.from.Version
		}
		a.e.logger.InfoContext(ctx, "resuming a record another definition wrote",
			a.logAttrs("", slog.String("from_version", from), slog.String("version", sp.Version),
				slog.String("after", r.point))...)
	}
	return nil
}

// restoreCommittedState puts the state the record last committed back in
// place of the attempt's, which could not be encoded (encodeErr: a NaN, a
// MarshalJSON that fails): a workflow giving up must still undo what its
// steps did, and its compensations run with the state as committed. It
// reads the record in the open transaction, if any.
func (a *attempt[Req, State]) restoreCommittedState(ctx context.Context, encodeErr error) error {
	rec, err := a.store().Load(ctx, a.key)
	if err != nil {
		return fmt.Errorf("encoding the state failed (%w), and reading the committed one to undo with failed: %w", encodeErr, err)
	}
	var committed State
	if len(rec.State) > 0 {
		if err := json.Unmarshal(rec.State, &committed); err != nil {
			return fmt.Errorf("encoding the state failed (%w), and decoding the committed one to undo with failed: %w", encodeErr, err)
		}
	}
	a.run.State = committed
	a.e.logger.WarnContext(ctx, "the state cannot be encoded; undoing with the state as last committed",
		a.logAttrs("", slog.Any("error", encodeErr))...)
	return nil
}

// unreadableError reports a stored request or state that the running
// definition cannot decode: written by another definition (whose upgrader,
// if any, refused it), or by this one under a type whose JSON changed
// without changing the definition (a custom UnmarshalJSON, say). Every
// attempt would read the same JSON and fail, and the compensations must not
// run with a request or a state never read, so the record is parked for an
// operator instead, with this as the reason.
type unreadableError struct {
	what    string // "request" or "state"
	writer  string // the fingerprint of the definition that wrote the state
	version string // the running definition's
	err     error
}

func (e *unreadableError) Error() string {
	if e.what == "request" {
		return fmt.Sprintf("cannot read its stored request as version %s's request: %v", e.version, e.err)
	}
	return fmt.Sprintf("cannot read the state written by definition %s as version %s's state: %v",
		cmp.Or(e.writer, "(none recorded)"), e.version, e.err)
}

func (e *unreadableError) Unwrap() error { return e.err }

// park parks the record this attempt claimed: the running definition may
// not resume it (reason says why: its definition changed before its
// recovery point, or its request or state does not decode). Its lease ends with it, so that no
// process loops on it; a retry gets ErrParked until an operator acts.
func (a *attempt[Req, State]) park(ctx context.Context, reason string) (*Result, error) {
	err := seam.StoreOf(a.store()).Park(ctx, a.rec.Fence(), reason)
	if err == nil && a.tx != nil {
		err = a.commit(ctx)
	}
	if err != nil {
		return a.failed(ctx, "", fmt.Errorf("park: %w", fenced(err)))
	}
	a.claimOpen = false
	a.e.logger.WarnContext(ctx, "record parked: the running definition may not resume it; it waits for an operator",
		a.logAttrs("", slog.String("recorded_definition", a.rec.Definition), slog.String("version", a.w.spec().Version),
			slog.String("recovery_point", a.rec.RecoveryPoint), slog.String("reason", reason))...)
	a.e.observeParked(a.w.name)
	return nil, &recovery.ParkedError{Key: a.key, Reason: reason}
}

// handOver gives the record to d, the registered version that wrote it
// (see Versions). A claim still uncommitted rolls back, leaving the record
// as it was; a committed takeover hands its lease back without counting an
// attempt. d then takes the record over as Resume would.
func (a *attempt[Req, State]) handOver(ctx context.Context, d runnable) (*Result, error) {
	version := d.spec().Version
	if a.hops >= maxHops {
		return a.failed(ctx, "", fmt.Errorf("the record's definition changed while it was handed to version %s", version))
	}
	if a.claimOpen {
		a.rollback()
		a.claimOpen = false
	} else {
		a.rollback()
		if err := seam.StoreOf(a.e.store).HandBack(ctx, a.rec.Fence(), "handed to version "+version+", which wrote the record"); err != nil {
			return nil, &StepError{Workflow: a.w.name, Attempt: a.run.Attempt, Err: fenced(err)}
		}
	}
	return d.resume(ctx, a.e, a.rec, a.hops+1)
}

// claimWith claims the key: on its own, or opening the transaction of the
// first phase (in one round trip when the attempt has a pipelined claim).
// Taking a connection and the claim are bounded by Config.DBTimeout: past
// it, the attempt runs nothing and reports ErrUnavailable.
func (a *attempt[Req, State]) claimWith(ctx context.Context, folded bool) (*recovery.Record, recovery.Outcome, error) {
	claimCtx, cancel := context.WithTimeout(ctx, a.e.dbTimeout)
	defer cancel()
	rec, outcome, err := a.claimWithin(claimCtx, folded)
	var inFlight *recovery.InFlightError
	if folded && errors.As(err, &inFlight) && inFlight.Contended {
		// The locked key ended the claim's transaction. Try once more in a
		// new one: a duplicate of a running first phase is refused the key
		// lock again at once, while a claim that followed a finished one
		// reads its record.
		a.rollback()
		rec, outcome, err = a.claimWithin(claimCtx, folded)
	}
	if err != nil && claimCtx.Err() != nil && ctx.Err() == nil {
		err = fmt.Errorf("%w: no answer within %s (Config.DBTimeout): %w", ErrUnavailable, a.e.dbTimeout, err)
	}
	return rec, outcome, err
}

// claimWithin claims as claimWith says, noting in claimSent when the claim
// was sent, once it had a connection: the lease runs from then.
func (a *attempt[Req, State]) claimWithin(ctx context.Context, folded bool) (rec *recovery.Record, outcome recovery.Outcome, err error) {
	if !folded {
		conn, err := a.e.acquire(ctx)
		if err != nil {
			return nil, 0, fmt.Errorf("acquire a connection: %w", err)
		}
		defer conn.Release()
		a.claimSent = time.Now()
		return a.claim(ctx, seam.StoreOf(a.e.store).WithConn(conn))
	}
	a.claimOpen = true
	if a.pipelined == nil {
		if err := a.begin(ctx); err != nil {
			return nil, 0, err
		}
		a.claimSent = time.Now()
		return a.claim(ctx, a.store())
	}
	conn, rollback := a.e.kept.take(), true
	if conn == nil {
		if conn, err = a.e.acquire(ctx); err != nil {
			return nil, 0, fmt.Errorf("acquire a connection: %w", err)
		}
		rollback = false
	}
	a.conn = conn
	a.claimSent = time.Now()
	mark := opentx.NewMark()
	rec, outcome, err = a.pipelined(ctx, conn.Conn, rollback, mark)
	if err != nil || outcome == recovery.OutcomeReplay {
		return rec, outcome, err
	}
	a.tx = opentx.New(conn.Conn.Conn(), "", mark)
	return rec, outcome, nil
}

// runStep runs step, atomic or foreign, within a span of its own.
func (a *attempt[Req, State]) runStep(ctx context.Context, step phase.Step[Req, State]) (res *Result, err error) {
	ctx, span := a.startStep(ctx, step)
	defer func() { tracing.End(span, failure(err)) }() // a panic ends it too
	if step.Kind() == phase.KindAtomic {
		return a.atomic(ctx, step)
	}
	return a.foreign(ctx, step)
}

// atomic runs an atomic phase in the open transaction (begun here if none
// is) and commits it with the recovery point, or with the response when it
// is the last step.
func (a *attempt[Req, State]) atomic(ctx context.Context, step phase.Step[Req, State]) (*Result, error) {
	if a.tx == nil {
		if err := a.beginHeld(ctx, step.Name()); err != nil {
			return a.failed(ctx, step.Name(), err)
		}
	}
	err := a.runAtomic(ctx, step)
	if a.tx.Ended() || (rollsBack(err) && a.tx.Restarted(ctx)) {
		return a.txEndedByStep(ctx, step.Name())
	}
	if o, ok := asOutcome(err); ok {
		return a.respondOrReject(ctx, step.Name(), o)
	}
	if err != nil {
		return a.failed(ctx, step.Name(), err)
	}
	if a.next == len(a.w.steps)-1 {
		return a.respond(ctx, step.Name(), nil)
	}
	if err := a.beforeCommit(ctx, step.Name()); err != nil {
		return nil, err
	}
	state, err := json.Marshal(a.run.State)
	if err != nil {
		return a.failed(ctx, step.Name(), fmt.Errorf("encode state: %w", err))
	}
	if err := a.commitWith(ctx, func(conn seam.Conn, mark string) error {
		return seam.StoreOf(a.e.store).AdvanceAndCommit(ctx, conn, mark, a.rec.Fence(), step.Name(), state)
	}); err != nil {
		return a.failed(ctx, step.Name(), err)
	}
	a.next++
	return nil, a.e.crashPoint(ctx, a.key, AfterCommit, step.Name())
}

// rollsBack reports whether a phase that returned err has its transaction
// rolled back (an error, a Reject), rather than committed (nil, Respond,
// Abort): before a rollback the attempt asks whether the phase restarted
// its transaction (opentx.Tx.Restarted), since what it wrote before the
// restart is committed and the rollback would leave it for a retry to make
// again; a commit finds that out by itself.
func rollsBack(err error) bool {
	if o, ok := asOutcome(err); ok {
		return o.reject
	}
	return err != nil
}

// atomicTries is how often an atomic phase runs within one attempt when
// its transaction is the victim of a deadlock or a serialization failure.
const atomicTries = 3

// conflictWait is the longest wait before the second run of a phase that
// lost a conflict (twice that before the third).
const conflictWait = 50 * time.Millisecond

// runAtomic runs an atomic phase's function in the open transaction. When
// the transaction fails with a deadlock or a serialization failure, which
// the database resolves by rolling one side back, and the claim is not in
// it, the phase runs again in a new transaction, from the state it started
// with, up to atomicTries times.
func (a *attempt[Req, State]) runAtomic(ctx context.Context, step phase.Step[Req, State]) error {
	var before []byte // the state the phase started with, once a retry needs it
	for try := 1; ; try++ {
		// While the claim is uncommitted in the transaction, the row is
		// locked by this attempt and no takeover is possible: no heartbeat
		// is needed.
		stepCtx, stop := a.heartbeat(ctx, step.Name(), !a.claimOpen)
		if try == 1 && !a.claimOpen {
			var err error
			if before, err = json.Marshal(a.run.State); err != nil {
				_ = stop()
				return fmt.Errorf("encode state: %w", err)
			}
		}
		started := a.e.now()
		err := seam.StepOf(step).RunAtomic(stepCtx, a.tx, &a.run)
		a.e.observeStep(a.w.name, step.Name(), started, err)
		if lost := stop(); lost != nil {
			return lost
		}
		if try == atomicTries || before == nil || a.tx.Ended() || !conflicted(err) {
			return err
		}
		a.e.logger.InfoContext(ctx, "atomic phase's transaction lost a conflict; running it again",
			a.logAttrs(step.Name(), slog.Int("try", try), slog.Any("error", err))...)
		a.e.observeRetry(a.w.name, step.Name())
		a.rollback()
		// A short random wait lets the other side, woken by this rollback,
		// take the locks first rather than meet this one again.
		if err := sleep.For(ctx, time.Duration(rand.Int64N(int64(conflictWait)*int64(try)))); err != nil {
			return err
		}
		var fresh State
		if err := json.Unmarshal(before, &fresh); err != nil {
			return fmt.Errorf("restore state: %w", err)
		}
		a.run.State = fresh
		if err := a.beginHeld(ctx, step.Name()); err != nil {
			return err
		}
	}
}

// conflicted reports a transaction the database rolled back to resolve a
// conflict with another: a deadlock or a serialization failure.
func conflicted(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// foreign runs a foreign mutation outside any transaction. Its result is
// committed with the next atomic phase, or right away when none follows. A
// call is not started once the lease may have ended.
func (a *attempt[Req, State]) foreign(ctx context.Context, step phase.Step[Req, State]) (*Result, error) {
	stepCtx, stop := a.heartbeat(ctx, step.Name(), true)
	err := context.Cause(stepCtx)
	if err == nil {
		a.acted = true
		started := a.e.now()
		err = seam.StepOf(step).RunForeign(stepCtx, &a.run)
		a.e.observeStep(a.w.name, step.Name(), started, err)
	}
	if lost := stop(); lost != nil {
		err = lost
	}
	if o, ok := asOutcome(err); ok {
		return a.respondOrReject(ctx, step.Name(), o)
	}
	if err != nil {
		res, err := a.failed(ctx, step.Name(), err)
		return res, markForeign(err)
	}
	if err := a.e.crashPoint(ctx, a.key, AfterForeignCall, step.Name()); err != nil {
		return nil, err
	}
	if a.next == len(a.w.steps)-1 {
		return a.respond(ctx, step.Name(), nil)
	}
	if a.w.steps[a.next+1].Kind() == phase.KindAtomic {
		a.next++ // committed with the next phase
		return nil, nil
	}
	if err := a.advance(ctx, step.Name()); err != nil {
		return a.failed(ctx, step.Name(), err)
	}
	return nil, a.e.crashPoint(ctx, a.key, AfterCommit, step.Name())
}

// advance records step as the recovery point, with the state, in the open
// transaction (or on its own), and moves on to the next step.
func (a *attempt[Req, State]) advance(ctx context.Context, step string) error {
	state, err := json.Marshal(a.run.State)
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	sent := time.Now()
	if err := a.store().Advance(ctx, a.rec.Fence(), step, state); err != nil {
		return fenced(err)
	}
	if a.tx == nil {
		a.extended(sent)
	}
	a.next++
	return nil
}

// respond completes the key with resp (nil: the response built from the
// final state) after step, in the open transaction or on its own, and
// returns the result: the response as stored, as every replay will see it.
func (a *attempt[Req, State]) respond(ctx context.Context, step string, resp *Response) (*Result, error) {
	if resp == nil {
		built, err := a.buildResponse()
		if err != nil {
			return a.failed(ctx, step, err)
		}
		resp = &built
	}
	state, err := json.Marshal(a.run.State)
	if err != nil {
		return a.failed(ctx, step, fmt.Errorf("encode state: %w", err))
	}
	if a.tx == nil {
		err = fenced(seam.StoreOf(a.e.store).CompleteAfter(ctx, a.rec.Fence(), step, state, *resp))
		a.acted = a.acted || err == nil
	} else if err = a.beforeCommit(ctx, step); err != nil {
		return nil, err
	} else {
		err = a.commitWith(ctx, func(conn seam.Conn, mark string) error {
			return seam.StoreOf(a.e.store).CompleteAndCommit(ctx, conn, mark, a.rec.Fence(), step, state, *resp)
		})
	}
	if err != nil {
		return a.failed(ctx, step, err)
	}
	if err := a.e.crashPoint(ctx, a.key, AfterCommit, step); err != nil {
		return nil, err
	}
	return &Result{Response: seam.StoreOf(a.e.store).Stored(*resp), Outcome: a.outcome, ResumedFrom: a.resumedFrom()}, nil
}

func (a *attempt[Req, State]) buildResponse() (resp Response, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &phase.PanicError{Step: "Finish", Value: v, Stack: debug.Stack()}
		}
	}()
	return a.w.response(&a.run.State), nil
}

// respondOrReject ends the workflow as a step asked: a Respond, or a
// Reject that may not leave the key free (see rejectable), is stored.
func (a *attempt[Req, State]) respondOrReject(ctx context.Context, step string, o *outcome) (*Result, error) {
	if o.abort {
		return a.giveUp(ctx, step, a.rec, a.run.Attempt, o, &o.resp)
	}
	if !o.reject || !a.rejectable() {
		return a.respond(ctx, step, &o.resp)
	}
	a.rollback()
	cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	reclaim := a.outcome == recovery.OutcomeTakeover
	rec, ok := a.recordAfterRollback(cleanupCtx, reclaim)
	if !ok && reclaim {
		// Another attempt got to the record meanwhile: its answer is the
		// key's, and what it did is not this Reject's to forget.
		return a.failed(ctx, step, &lostLease{fmt.Errorf("%w: another attempt took the record over while this one rejected it", ErrLeaseLost)})
	}
	if ok {
		err := a.e.store.DeleteUnstarted(cleanupCtx, rec.Fence())
		if errors.Is(err, ErrLeaseLost) {
			// Another attempt took the key over: its answer is the key's.
			return a.failed(ctx, step, &lostLease{err})
		}
		if err != nil {
			a.e.logger.WarnContext(ctx, "could not delete a rejected claim", a.logAttrs(step, slog.Any("error", err))...)
		}
	}
	return &Result{Response: o.resp, Outcome: a.outcome, Rejected: true}, nil
}

// retried logs and counts a retry of a call within step (foreign.Retry):
// try failed with err, and the next follows after wait.
func (a *attempt[Req, State]) retried(ctx context.Context, step string, try int, err error, wait time.Duration) {
	a.e.logger.InfoContext(ctx, "foreign call failed; retrying within the attempt",
		a.logAttrs(step, slog.Int("try", try), slog.Duration("wait", wait), slog.Any("error", err))...)
	a.e.observeRetry(a.w.name, step)
	a.retriedStep = step
}

// rejectable reports whether a Reject may delete the record, leaving the
// key free for a fresh execution: only when nothing outside the database
// can have happened under the record, since a fresh execution gets a new
// record id and so new downstream keys, and a foreign call made under the
// old ones would be made again. That holds when no recovery point is
// committed, this is the first step, and no earlier attempt can have
// started a foreign call: the record is new, or the workflow starts with an
// atomic phase (an earlier attempt got no further than that phase without
// committing a recovery point).
func (a *attempt[Req, State]) rejectable() bool {
	return !a.committed && a.next == 0 &&
		(a.outcome == recovery.OutcomeNew || a.w.steps[0].Kind() == phase.KindAtomic)
}

// failed handles a step's error: roll back, then hand the lease back so a
// retry can take over at once. A failure counts as an attempt, and the
// MaxAttempts-th fails the key terminally; a caller that went away does
// not count. An error marked phase.Permanent fails the key terminally at
// once; a *phase.DeferError releases the lease (it counts, so that
// MaxAttempts bounds a downstream that defers for ever, unless it only
// waited for its turn: see turnOnly), and no takeover may follow before
// its After has passed. A lost lease releases nothing: the key is someone
// else's.
func (a *attempt[Req, State]) failed(ctx context.Context, step string, cause error) (*Result, error) {
	if errors.Is(cause, opentx.ErrEnded) {
		return a.txEndedByStep(ctx, step) // found by the commit's check of the mark
	}
	a.rollback()
	stepErr := &StepError{Workflow: a.w.name, Step: step, Attempt: a.run.Attempt, Err: cause}
	var (
		panicErr *phase.PanicError
		lost     *lostLease
		deferred *phase.DeferError
	)
	permanent := phase.IsPermanent(cause) // wins over a deferral it wraps
	isDeferred := !permanent && errors.As(cause, &deferred)
	counted := !isDeferred || !turnOnly(cause)
	switch {
	case errors.As(cause, &lost):
		a.e.observeLeaseLost(a.w.name)
		a.e.logger.WarnContext(ctx, "lease lost; this attempt's uncommitted writes rolled back", a.logAttrs(step, slog.Any("error", cause))...)
		return nil, stepErr
	case errors.As(cause, &panicErr):
		a.e.logger.ErrorContext(ctx, "workflow step panicked",
			a.logAttrs(step, slog.Any("panic", panicErr.Value), slog.String("stack", string(panicErr.Stack)))...)
	case permanent, isDeferred:
		// Logged below, once the record says what happens next.
	case ctx.Err() != nil:
		a.e.logger.InfoContext(ctx, "caller went away; the work stays resumable", a.logAttrs(step)...)
	default:
		a.e.logger.WarnContext(ctx, "workflow step failed", a.logAttrs(step, slog.Any("error", cause))...)
	}
	cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	rec, ok := a.recordAfterRollback(cleanupCtx, true)
	if !ok {
		return nil, stepErr
	}
	if rec.Compensating() {
		// An attempt at the compensations that failed before reaching
		// them (it could not read the record): they count its attempts.
		a.rec = rec
		return a.compensationFailed(ctx, cmp.Or(step, rec.Undo[0]), cause)
	}
	spent := counted && a.e.maxAttempts > 0 && rec.Attempts+1 >= a.e.maxAttempts
	var err error
	switch {
	case (permanent || spent) && !a.placed && !a.wentAway(ctx):
		// The record ends before an attempt could read it as this
		// definition does (its route, its state): giving up now would
		// undo by a guess at which steps it did. An operator decides.
		a.rec = rec
		return a.park(ctx, fmt.Sprintf("it failed for good before an attempt could read it as version %s: %v", a.w.spec().Version, cause))
	case permanent:
		return a.giveUp(ctx, step, rec, rec.Attempts+1, cause, nil)
	case a.wentAway(ctx):
		err = seam.StoreOf(a.e.store).HandBack(cleanupCtx, rec.Fence(), stepErr.Error())
	case spent:
		return a.giveUp(ctx, step, rec, rec.Attempts+1, cause, nil)
	case isDeferred:
		err = a.deferKey(ctx, cleanupCtx, rec, step, deferred, stepErr, counted)
	default:
		err = a.e.store.Release(cleanupCtx, rec.Fence(), stepErr.Error())
	}
	if err != nil {
		a.e.logger.WarnContext(ctx, "could not hand the lease back", a.logAttrs(step, slog.Any("error", err))...)
	}
	return nil, stepErr
}

// deferKey releases rec's lease, counting an attempt if counted, deferred as d asks (at most recovery.MaxDefer): no claim, Resume or completer
// takes the record over before then.
func (a *attempt[Req, State]) deferKey(ctx, cleanupCtx context.Context, rec *recovery.Record, step string,
	d *phase.DeferError, stepErr *StepError, counted bool) error {
	notBefore, err := seam.StoreOf(a.e.store).HandBackFor(cleanupCtx, rec.Fence(), d.After, stepErr.Error(), counted)
	if err == nil {
		a.e.observeDeferred(a.w.name, step)
		a.e.logger.InfoContext(ctx, "workflow step deferred; the key is handed back until then",
			a.logAttrs(step, slog.Time("not_before", notBefore), slog.Any("error", d.Err))...)
	}
	return err
}

// turnOnly reports a deferral of a paced call that only waited for its
// turn (a slot or a token of its Pace, not a circuit a downstream opened):
// it called nothing and failed at nothing, so it spends no attempt. A busy
// downstream must delay keys, not fail them after MaxAttempts turns.
func turnOnly(cause error) bool {
	var w *foreign.WaitError
	return errors.As(cause, &w) && !w.Circuit
}

// wentAway reports an attempt that stopped because its caller cancelled it
// before it did anything a rollback cannot undo: the one kind of stop that
// does not count against MaxAttempts. A deadline (the caller's, or the
// completer's ResumeTimeout) counts: a step that always outlives it must
// not be resumed for ever.
func (a *attempt[Req, State]) wentAway(ctx context.Context) bool {
	return errors.Is(ctx.Err(), context.Canceled) && !a.acted
}

// recordAfterRollback returns the record as this attempt owns it once its
// transaction rolled back. A claim that was uncommitted in that transaction
// rolled back too; when reclaim is set, the key is claimed again, on its
// own, so that the outcome can be recorded, unless another attempt got
// there first, or took it over meanwhile and moved it on (this attempt
// hands it back then).
func (a *attempt[Req, State]) recordAfterRollback(ctx context.Context, reclaim bool) (*recovery.Record, bool) {
	if !a.claimOpen {
		return a.rec, a.rec != nil
	}
	a.claimOpen = false
	if !reclaim {
		return nil, false
	}
	rec, outcome, err := a.claim(ctx, a.e.store)
	if err != nil || outcome == recovery.OutcomeReplay {
		return nil, false // another attempt got there first
	}
	if markOf(rec) != a.claimed || rec.Compensating() {
		// Another attempt took the key over between the rollback and this
		// claim, and moved the record on, ran it under another definition
		// or ended an attempt of its own: what this one ran into is not
		// the record's to answer for, nor its to undo or forget.
		a.handBackOvertaken(ctx, rec)
		return nil, false
	}
	if r := a.restamped; r != nil {
		if err := seam.StoreOf(a.e.store).Restamp(ctx, rec.Fence(), a.w.spec().Fingerprint, r.point, r.state); err != nil {
			a.handBackOvertaken(ctx, rec)
			return nil, false
		}
		rec.Definition, rec.RecoveryPoint = a.w.spec().Fingerprint, r.point
	}
	return rec, true
}

// handBackOvertaken hands back rec, claimed again after a rollback, which
// this attempt may not answer for.
func (a *attempt[Req, State]) handBackOvertaken(ctx context.Context, rec *recovery.Record) {
	if err := seam.StoreOf(a.e.store).HandBack(ctx, rec.Fence(), "an attempt overtaken while its claim was rolled back"); err != nil {
		a.e.logger.WarnContext(ctx, "could not hand the lease back", a.logAttrs("", slog.Any("error", err))...)
	}
}

// claimMark is what a claim found of a record that tells whether another
// attempt got to it since: any attempt that took it over and ended counts
// an attempt or moves it on, and one that ran it under another definition
// restamps it.
type claimMark struct {
	point, definition, resumeAs string
	attempts                    int
}

func markOf(rec *recovery.Record) claimMark {
	return claimMark{point: rec.RecoveryPoint, definition: rec.Definition, resumeAs: rec.ResumeAs, attempts: rec.Attempts}
}

// restamp is a restamp of the record (loadState): its recovery point in
// the running definition's names, and its upgraded state (nil: kept).
type restamp struct {
	point string
	state []byte
}

// failTerminally stores a 500 for the key, in the open transaction if any,
// and returns it: after attempts attempts, or at once when cause is
// permanent (phase.Permanent). An Abort's response (abort) is stored
// instead of the 500.
func (a *attempt[Req, State]) failTerminally(ctx context.Context, fence recovery.Fence, attempts int, cause error, abort *Response) (*Result, error) {
	permanent := phase.IsPermanent(cause)
	detail, lastError, msg := fmt.Sprintf("%s failed after %d attempts and will not be retried", a.w.name, attempts),
		fmt.Sprintf("after %d attempts: %v", attempts, cause), "workflow failed terminally"
	if permanent {
		detail, lastError, msg = fmt.Sprintf("%s failed with an error no retry can fix and will not be retried", a.w.name),
			fmt.Sprintf("at attempt %d: %v", attempts, cause), "workflow failed terminally: the step's error is permanent"
	}
	resp := Problem(500, detail)
	if abort != nil {
		resp, lastError, msg = *abort, fmt.Sprintf("aborted at attempt %d, with nothing to undo: %v", attempts, cause),
			"workflow aborted; nothing to undo"
	}
	if err := a.store().Fail(ctx, fence, resp, lastError); err != nil {
		a.rollback()
		return nil, &StepError{Workflow: a.w.name, Attempt: attempts, Err: fmt.Errorf("fail terminally: %w", err)}
	}
	if a.tx != nil {
		err := a.commit(ctx)
		if errors.Is(err, opentx.ErrEnded) {
			// A phase ended or restarted the transaction the failure was
			// written in: store it on its own, saying so.
			return a.failTerminally(ctx, fence, attempts, fmt.Errorf("%w; and %w", cause, err), abort)
		}
		if err != nil {
			return nil, &StepError{Workflow: a.w.name, Attempt: attempts, Err: err}
		}
	}
	a.e.logger.ErrorContext(ctx, msg,
		a.logAttrs("", slog.Int("attempts", attempts), slog.Bool("permanent", permanent), slog.Any("error", cause))...)
	return &Result{Response: seam.StoreOf(a.e.store).Stored(resp), Outcome: a.outcome, Failed: true}, nil
}

// begin takes a connection and opens a transaction on it.
func (a *attempt[Req, State]) begin(ctx context.Context) error {
	conn, err := a.e.acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire a connection: %w", err)
	}
	// The BEGIN goes with the phase's first statement.
	a.conn, a.tx = conn, opentx.New(conn.Conn.Conn(), beginSQL, opentx.NewMark())
	return nil
}

// beginHeld opens a transaction for step as begin does, keeping the lease
// while it waits for a connection: on a busy pool that wait can outlast
// the lease, and a lease that ran out there would be found lost only once
// the phase started, after another attempt may have taken the key.
func (a *attempt[Req, State]) beginHeld(ctx context.Context, step string) error {
	waitCtx, stop := a.heartbeat(ctx, step, true)
	err := a.begin(waitCtx)
	if lost := stop(); lost != nil {
		a.rollback()
		return lost
	}
	return err
}

// commitWith commits the open transaction with commit, which sends the
// check of the transaction's mark, the attempt's fenced write and the
// COMMIT in one round trip, and hands the connection back.
func (a *attempt[Req, State]) commitWith(ctx context.Context, commit func(conn seam.Conn, mark string) error) error {
	sent := time.Now()
	a.tx.End()            // the phase's turn is over
	err := a.tx.Open(ctx) // a phase that sent no statement
	if err == nil {
		err = commit(a.conn, a.tx.Mark())
	}
	if err != nil {
		a.rollback()
		if errors.Is(err, ErrLeaseLost) {
			return &lostLease{err}
		}
		if seam.StoreOf(a.e.store).CommitUnknown(err) {
			a.claimOpen = false // the commit may have landed: write with the fence from now on
		}
		// Otherwise the server refused the commit in a session that goes
		// on: nothing was committed, and a claim it carried rolled back
		// with it, as after a phase's error (recordAfterRollback).
		return err
	}
	a.conn.Release()
	a.conn, a.tx = nil, nil
	a.claimOpen = false
	a.extended(sent)
	return nil
}

// extended notes a commit of this attempt's, sent at sent: a recovery
// point (or the completion) is committed, and the lease runs from then.
func (a *attempt[Req, State]) extended(sent time.Time) {
	a.committed, a.acted = true, true
	if a.keeper != nil {
		a.keeper.Extended(sent)
	}
}

// txEndedByStep handles an atomic phase that committed or rolled back its
// own transaction, or restarted it (COMMIT AND CHAIN, COMMIT; BEGIN,
// ROLLBACK AND CHAIN), found right after the phase (opentx.Tx.Ended) or by
// the commit's check of the transaction's mark: what it wrote may be
// committed without the recovery point, so running the phase again could
// make its writes twice. The record fails terminally, for an operator to
// look at, and nothing runs again.
func (a *attempt[Req, State]) txEndedByStep(ctx context.Context, step string) (*Result, error) {
	a.claimOpen = false // a committed claim is committed; a rolled back one is gone
	a.rollback()
	cause := fmt.Errorf("step %s: %w; the record failed so that they are not made again", step, opentx.ErrEnded)
	a.e.logger.ErrorContext(ctx, "an atomic phase ended its own transaction", a.logAttrs(step)...)
	cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return a.failTerminally(cleanupCtx, a.rec.Fence(), a.run.Attempt, cause, nil)
}

// beforeCommit is the crash point before step's commit: a hook that stops
// the attempt there rolls the transaction back, as a process death would.
func (a *attempt[Req, State]) beforeCommit(ctx context.Context, step string) error {
	if err := a.e.crashPoint(ctx, a.key, BeforeCommit, step); err != nil {
		a.rollback()
		return err
	}
	return nil
}

// commit commits the open transaction on its own, behind the check of its
// mark: opentx.ErrEnded when a phase ended or restarted it, and nothing
// was committed then.
func (a *attempt[Req, State]) commit(ctx context.Context) error {
	a.tx.End()
	err := a.tx.Open(ctx)
	if err == nil {
		err = seam.StoreOf(a.e.store).CommitMarked(ctx, a.conn, a.tx.Mark())
	}
	if err != nil {
		a.rollback()
		a.claimOpen = false
		return err
	}
	a.conn.Release()
	a.conn, a.tx = nil, nil
	a.claimOpen = false
	return nil
}

// rollback ends the open transaction, if any, without committing, and hands
// the connection back. Its error is of no use: a failed rollback leaves
// nothing committed either, and the pool drops a connection left in a
// transaction.
func (a *attempt[Req, State]) rollback() {
	if a.tx != nil {
		a.tx.End()
	}
	if a.conn != nil {
		_, _ = a.conn.Exec(context.Background(), "rollback")
		a.conn.Release()
		a.conn, a.tx = nil, nil
	}
}

// endReadOnly rolls back a transaction that wrote nothing and hands its
// connection back.
func endReadOnly(conn *workConn) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	_, _ = conn.Exec(ctx, "rollback")
	conn.Release()
}

// store returns the engine's store, in the open transaction if any.
func (a *attempt[Req, State]) store() *recovery.Store {
	if a.tx == nil {
		return a.e.store
	}
	return a.e.store.WithTx(a.tx)
}

func (a *attempt[Req, State]) resumedFrom() string {
	if a.outcome == recovery.OutcomeTakeover {
		return a.rec.RecoveryPoint
	}
	return ""
}

func (a *attempt[Req, State]) logAttrs(step string, extra ...any) []any {
	attrs := []any{slog.String("workflow", a.w.name), slog.String("tenant", a.key.Tenant), slog.String("key", a.key.ID),
		slog.Int("attempt", a.run.Attempt)}
	if step != "" {
		attrs = append(attrs, slog.String("step", step))
	}
	return append(attrs, extra...)
}
