package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/onceflow/onceflow/internal/opentx"
	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/internal/tracing"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
)

// giveUp ends the workflow for good after cause, at the step being run
// (step, "" outside the steps), as rec, the record this attempt holds (a
// claim rolled back with the step's transaction was made again, under
// another owner): a phase.Permanent error, the last of
// MaxAttempts attempts, or an Abort (abort, its response). Before the point
// of no return, with started foreign steps that have compensations, the
// record starts compensating and this attempt runs them; otherwise the
// failure is stored (failTerminally). Writes go to the open transaction,
// if any, which an Abort's atomic phase left open with its writes.
func (a *attempt[Req, State]) giveUp(ctx context.Context, step string, rec *recovery.Record, attempts int, cause error, abort *Response) (*Result, error) {
	cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	fence := rec.Fence()
	var undo []string
	if failing, ok := a.failingStep(); ok {
		undo = a.w.undo(failing, a.refused(failing, cause, abort))
	}
	if len(undo) == 0 {
		if a.tx != nil {
			if err := a.beforeCommit(ctx, step); err != nil {
				return nil, err
			}
		}
		return a.failTerminally(cleanupCtx, fence, attempts, cause, abort)
	}
	resp := Problem(500, fmt.Sprintf("%s failed and will not be retried; what it had done was undone", a.w.name))
	if abort != nil {
		resp = *abort
	}
	var state []byte // nil keeps the committed one
	if a.loaded {
		var err error
		if state, err = json.Marshal(a.run.State); err != nil {
			// The compensations run with the state as last committed,
			// which Compensate keeps (state nil).
			if err := a.restoreCommittedState(cleanupCtx, err); err != nil {
				a.rollback()
				return a.failTerminally(cleanupCtx, fence, attempts, fmt.Errorf("%w; then %w", cause, err), abort)
			}
			state = nil
		}
	}
	if a.tx != nil {
		if err := a.beforeCommit(ctx, step); err != nil {
			return nil, err
		}
	}
	sent := time.Now()
	err := seam.StoreOf(a.store()).Compensate(cleanupCtx, fence, undo, resp, state,
		fmt.Sprintf("undoing %s after: %v", strings.Join(undo, ", "), cause))
	if err == nil && a.tx != nil {
		err = a.commit(cleanupCtx)
		if errors.Is(err, opentx.ErrEnded) {
			return a.txEndedByStep(ctx, step)
		}
	}
	if err != nil {
		a.rollback()
		return nil, &StepError{Workflow: a.w.name, Step: step, Attempt: attempts, Err: fmt.Errorf("start compensating: %w", fenced(err))}
	}
	a.claimOpen = false
	if !a.loaded {
		// This attempt failed before it read the record's request and
		// state: the compensations must not run with neither. It hands the
		// key back, compensating, to the next attempt.
		a.e.logger.WarnContext(ctx, "workflow failed before its point of no return; the next attempt undoes what its steps did",
			a.logAttrs(step, slog.Any("undo", undo), slog.Any("error", cause))...)
		if err := seam.StoreOf(a.e.store).HandBack(cleanupCtx, fence, "compensating after: "+cause.Error()); err != nil {
			a.e.logger.WarnContext(ctx, "could not hand the lease back", a.logAttrs(step, slog.Any("error", err))...)
		}
		return nil, &StepError{Workflow: a.w.name, Step: step, Attempt: attempts, Err: cause}
	}
	if rec != a.rec {
		// Claimed again after a rollback: keep the new claim's lease,
		// which the statement that starts compensating extended.
		a.rec = rec
		a.keepLease(ctx, sent)
	} else {
		a.extended(sent)
	}
	stored := seam.StoreOf(a.e.store).Stored(resp)
	a.rec.Undo, a.rec.Response, a.rec.Attempts = undo, &stored, 0
	a.e.logger.WarnContext(ctx, "workflow failed before its point of no return; undoing what its steps did",
		a.logAttrs(step, slog.Any("undo", undo), slog.Bool("aborted", abort != nil), slog.Any("error", cause))...)
	return a.compensate(ctx)
}

// refused reports whether the step at index failing, which ended the
// workflow with cause (abort, its Abort's response), did nothing to undo:
// it aborted (it decided instead of acting) or its call was refused for
// good (a permanent error), and no earlier call of it can have reached the
// other system. An earlier one can have when an earlier attempt may have
// made it (this attempt took the record over, and the step is the first
// after the recovery point it found) or an earlier try of this attempt's
// did (foreign.Retry): neither this try's decision nor a refusal of the
// repeat (409, the key in use) says anything of what the first call did.
func (a *attempt[Req, State]) refused(failing int, cause error, abort *Response) bool {
	if !a.placed || (abort == nil && !phase.IsPermanent(cause)) {
		return false // not the step's own decision or refusal
	}
	calledBefore := (a.outcome == recovery.OutcomeTakeover && failing == a.first) ||
		a.retriedStep == a.w.steps[min(failing, len(a.w.steps)-1)].Name()
	return !calledBefore
}

// failingStep returns the index of the step the attempt was running when
// it gave up, once it has placed itself among the steps (an attempt that
// did not gives up only by parking: see failed).
func (a *attempt[Req, State]) failingStep() (int, bool) {
	return a.next, a.placed
}

// compensate runs the compensations the record still lists (Record.Undo),
// in order, each committed on its own: the last commit finishes the record
// as compensated, and the stored failure is the answer.
func (a *attempt[Req, State]) compensate(ctx context.Context) (*Result, error) {
	for len(a.rec.Undo) > 0 {
		name := a.rec.Undo[0]
		i, ok := a.w.indexOf(a.w.spec().renamedTo(name))
		if !ok || !a.w.steps[i].Compensable() {
			return a.park(ctx, fmt.Sprintf("step %s is to be undone, and version %s has no compensation for it", name, a.w.spec().Version))
		}
		if err := a.e.crashPoint(ctx, a.key, BeforeCompensation, name); err != nil {
			return nil, err
		}
		finished, res, err := a.undo(ctx, name, i)
		if res != nil || err != nil {
			return res, err
		}
		if finished {
			break
		}
	}
	a.e.logger.InfoContext(ctx, "workflow compensated: what its steps did is undone", a.logAttrs("")...)
	return &Result{Response: *a.rec.Response, Outcome: a.outcome, ResumedFrom: a.resumedFrom(), Compensated: true}, nil
}

// undo runs the compensation of the step at index i, named name, and
// commits it, within a span of its own. finished reports that it was the
// last: the record is compensated.
func (a *attempt[Req, State]) undo(ctx context.Context, name string, i int) (finished bool, res *Result, err error) {
	ctx, span := a.startCompensation(ctx, name)
	defer func() { tracing.End(span, failure(err)) }()
	a.run.KeyStep = a.w.keyStep(i)
	stepCtx, stop := a.heartbeat(ctx, name, true)
	err = context.Cause(stepCtx)
	if err == nil {
		a.acted = true
		started := a.e.now()
		err = seam.StepOf(a.w.steps[i]).RunCompensation(stepCtx, &a.run)
		a.e.observeCompensation(a.w.name, name, started, err)
	}
	if lost := stop(); lost != nil {
		err = lost
	}
	if err != nil {
		res, err = a.compensationFailed(ctx, name, err)
		return false, res, markForeign(err)
	}
	if err := a.e.crashPoint(ctx, a.key, AfterCompensationCall, name); err != nil {
		return false, nil, err
	}
	state, err := json.Marshal(a.run.State)
	if err != nil {
		res, err = a.compensationFailed(ctx, name, phase.Permanent(fmt.Errorf("encode state: %w", err)))
		return false, res, err
	}
	sent := time.Now()
	finished, err = seam.StoreOf(a.e.store).Undone(ctx, a.rec.Fence(), name, state)
	if err != nil {
		res, err = a.compensationFailed(ctx, name, fenced(err))
		return false, res, err
	}
	a.extended(sent)
	a.rec.Undo = a.rec.Undo[1:]
	return finished, nil, a.e.crashPoint(ctx, a.key, AfterCompensationCommit, name)
}

// compensationFailed handles a compensation's error as failed handles a
// step's, with the compensations' own count of attempts: the key is
// handed back for the next attempt to run the compensation again, or,
// when cause is permanent or the attempts are spent, the record fails with
// what is left to undo, for an operator.
func (a *attempt[Req, State]) compensationFailed(ctx context.Context, step string, cause error) (*Result, error) {
	stepErr := &StepError{Workflow: a.w.name, Step: step + " (compensation)", Attempt: a.rec.Attempts + 1, Err: cause}
	var (
		lost     *lostLease
		deferred *phase.DeferError
	)
	if errors.As(cause, &lost) {
		a.e.observeLeaseLost(a.w.name)
		a.e.logger.WarnContext(ctx, "lease lost while compensating", a.logAttrs(step, slog.Any("error", cause))...)
		return nil, stepErr
	}
	if _, ok := asOutcome(cause); ok {
		cause = phase.Permanent(fmt.Errorf("a compensation may not answer for the workflow: %w", cause))
	}
	cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var err error
	switch {
	case phase.IsPermanent(cause):
		return a.compensationFailedForGood(cleanupCtx, step, cause)
	case errors.Is(ctx.Err(), context.Canceled):
		a.e.logger.InfoContext(ctx, "caller went away while compensating; the record stays compensating", a.logAttrs(step)...)
		err = seam.StoreOf(a.e.store).HandBack(cleanupCtx, a.rec.Fence(), stepErr.Error())
	case a.e.maxAttempts > 0 && a.rec.Attempts+1 >= a.e.maxAttempts && !(errors.As(cause, &deferred) && turnOnly(cause)):
		return a.compensationFailedForGood(cleanupCtx, step, cause)
	case errors.As(cause, &deferred):
		err = a.deferKey(ctx, cleanupCtx, a.rec, step, deferred, stepErr, !turnOnly(cause))
	default:
		a.e.logger.WarnContext(ctx, "compensation failed; the next attempt runs it again", a.logAttrs(step, slog.Any("error", cause))...)
		err = a.e.store.Release(cleanupCtx, a.rec.Fence(), stepErr.Error())
	}
	if err != nil {
		a.e.logger.WarnContext(ctx, "could not hand the lease back", a.logAttrs(step, slog.Any("error", err))...)
	}
	return nil, stepErr
}

// compensationFailedForGood fails a compensating record: its stored answer
// becomes a 500, and the steps still to undo stay listed for an operator.
func (a *attempt[Req, State]) compensationFailedForGood(ctx context.Context, step string, cause error) (*Result, error) {
	resp := Problem(500, fmt.Sprintf("%s failed, and undoing what it had done failed too; it will not be retried", a.w.name))
	lastError := fmt.Sprintf("compensation of %s failed for good (steps left to undo: %s): %v", step, strings.Join(a.rec.Undo, ", "), cause)
	if err := a.e.store.Fail(ctx, a.rec.Fence(), resp, lastError); err != nil {
		return nil, &StepError{Workflow: a.w.name, Step: step, Attempt: a.rec.Attempts + 1, Err: fmt.Errorf("fail terminally: %w", fenced(err))}
	}
	a.e.logger.ErrorContext(ctx, "compensation failed for good; an operator must undo the rest",
		a.logAttrs(step, slog.Any("undo", a.rec.Undo), slog.Any("error", cause))...)
	return &Result{Response: seam.StoreOf(a.e.store).Stored(resp), Outcome: a.outcome, Failed: true}, nil
}
