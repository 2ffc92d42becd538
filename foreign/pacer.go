package foreign

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/dbschema"
	"github.com/onceflow/onceflow/internal/sleep"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
)

// Waits of a Pacer.
const (
	// PaceWaitDefault bounds a wait for a turn when the lease is not known.
	PaceWaitDefault = 10 * time.Second
	// slotPollMin and slotPollMax bound the pause between two looks for a
	// free slot; the pause doubles from the first to the second.
	slotPollMin = 5 * time.Millisecond
	slotPollMax = 200 * time.Millisecond
	// releaseTimeout bounds giving a slot back after the call.
	releaseTimeout = 5 * time.Second
	// slotMargin: a call is cancelled once its slot's lease, unrenewed,
	// has less than 1/slotMargin of it left, so that it has stopped before
	// another process may claim the slot.
	slotMargin = 6
)

// PacerConfig configures a Pacer.
type PacerConfig struct {
	// Schema holds onceflow's tables. "" means "public".
	Schema string
	// Limits are the Paces by downstream name.
	Limits map[string]Pace
	// Waited, if set, hears of each call that waited for its turn, and how
	// long.
	Waited func(downstream string, waited time.Duration)
	// Opened, if set, hears of each answer that opened a circuit, and for
	// how long.
	Opened func(downstream string, open time.Duration)
	// Deferred, if set, hears of each call that deferred its key instead of
	// waiting (see WaitError).
	Deferred func(downstream string, err *WaitError)
}

// Pacer enforces Paces through the database, across every process sharing
// it (phase.Pacer). Each of its statements is a transaction of its own, so
// it works behind PgBouncer's transaction pooling. The engine builds one
// from workflow.Config Pacing; build one yourself only to pace calls
// outside workflows.
type Pacer struct {
	db     recovery.DBTX
	schema string
	limits map[string]Pace
	cfg    PacerConfig
	sql    pacerSQL
	// sleep waits d or until ctx ends; tests replace it (export_test.go).
	sleep func(ctx context.Context, d time.Duration) error
}

var _ phase.Pacer = (*Pacer)(nil)

type pacerSQL struct{ reserve, open, claim, slots, renew, release string }

// notMigrated names the migration a statement's missing table needs.
func (p *Pacer) notMigrated(err error) error { return recovery.NotMigrated(p.schema, err) }

// NewPacer returns a Pacer for cfg.Limits in db. A Pace out of range, or a
// name a Limit would refuse, is an error matching ErrInvalidPace.
func NewPacer(db recovery.DBTX, cfg PacerConfig) (*Pacer, error) {
	schema, err := dbschema.Resolve(cfg.Schema)
	if err != nil {
		return nil, err
	}
	for name, p := range cfg.Limits {
		if err := recovery.CheckName("downstream", name); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidPace, err)
		}
		if err := p.validate(); err != nil {
			return nil, fmt.Errorf("%w: downstream %q: %v", ErrInvalidPace, name, err)
		}
	}
	return &Pacer{db: db, schema: schema, limits: maps.Clone(cfg.Limits), cfg: cfg, sleep: sleep.For, sql: pacerSQL{
		reserve: dbschema.Expand(reserveSQL, schema), open: dbschema.Expand(openSQL, schema),
		claim: dbschema.Expand(claimSlotSQL, schema), slots: dbschema.Expand(makeSlotsSQL, schema),
		renew: dbschema.Expand(renewSlotSQL, schema), release: dbschema.Expand(releaseSlotSQL, schema),
	}}, nil
}

// Pace runs call once downstream's Pace lets it (phase.Pacer): a slot of
// its Concurrency, held until call returns; a token of its Rate; a closed
// circuit. It waits outside any transaction; a wait longer than lease/3
// (PaceWaitDefault when lease is 0) returns phase.Defer with a *WaitError.
// An answer that asks the downstream to wait (circuitAnswer) opens its
// circuit.
func (p *Pacer) Pace(ctx context.Context, downstream, tenant string, lease time.Duration,
	call func(ctx context.Context) error) error {
	pace, ok := p.limits[downstream]
	if !ok {
		return fmt.Errorf("%w: %q (workflow.Config Pacing)", ErrUnknownDownstream, downstream)
	}
	t := turn{downstream: downstream, pace: pace, lease: lease, limit: PaceWaitDefault, started: time.Now()}
	if pace.PerTenant {
		t.scope = tenant
	}
	if lease > 0 {
		t.limit = lease / 3
	} else {
		t.lease = recovery.LeaseDefault
	}
	if pace.Concurrency > 0 {
		held, err := p.takeSlot(ctx, &t)
		if err != nil {
			return p.reportDeferral(err)
		}
		var stop context.CancelFunc
		ctx, stop = p.keepSlot(ctx, &t, held)
		defer stop()
	}
	if err := p.takeToken(ctx, &t); err != nil {
		return p.reportDeferral(err)
	}
	if t.waited && p.cfg.Waited != nil {
		p.cfg.Waited(downstream, time.Since(t.started))
	}
	err := call(ctx)
	if open := circuitAnswer(err); open > 0 {
		p.openCircuit(ctx, &t, open)
	}
	return err
}

// turn is one call's way through its Pace.
type turn struct {
	downstream, scope string
	pace              Pace
	lease             time.Duration // of a slot held
	limit             time.Duration // the longest wait before deferring
	started           time.Time
	waited            bool      // slept at least once
	claimSent         time.Time // when the claim of the slot held was sent
}

// left is how much longer t may wait before it defers.
func (t *turn) left() time.Duration { return t.limit - time.Since(t.started) }

// reportDeferral reports err to Deferred when it is a deferral, and returns
// it.
func (p *Pacer) reportDeferral(err error) error {
	var w *WaitError
	if p.cfg.Deferred != nil && errors.As(err, &w) {
		p.cfg.Deferred(w.Downstream, w)
	}
	return err
}

// takeToken reserves a token of t's rate, in a closed circuit, and sleeps
// until it is due. An open circuit is waited out first; a token or a
// circuit further away than t may wait defers.
func (p *Pacer) takeToken(ctx context.Context, t *turn) error {
	rate, burst := t.pace.bucket()
	for {
		var (
			granted, circuit bool
			secs             float64
		)
		left := max(t.left(), 0)
		err := p.db.QueryRow(ctx, p.sql.reserve, t.downstream, t.scope, rate, burst, left.Seconds()).Scan(&granted, &secs, &circuit)
		if errors.Is(err, pgx.ErrNoRows) {
			// Refused by a bucket a concurrent first call made, committed
			// after this statement's snapshot: the wait is not known; look
			// again.
			granted, secs, err = false, 0, nil
		}
		if err != nil {
			return fmt.Errorf("pace %s: take a token: %w", t.downstream, p.notMigrated(err))
		}
		wait := time.Duration(secs * float64(time.Second)) // at most a day and the longest wait: see PaceRateMin
		switch {
		case !granted && wait > left:
			return deferFor(t.downstream, t.scope, circuit, wait)
		case !granted:
			wait = max(wait, slotPollMin) // read from an older snapshot than the refusal's
		case wait <= 0:
			return nil
		}
		t.waited = true
		if err := p.sleep(ctx, wait); err != nil {
			return err
		}
		if granted {
			return nil
		}
	}
}

// openCircuit holds every call of t's downstream and scope back for open.
// A failure to write it is not the call's: the next such answer opens it.
func (p *Pacer) openCircuit(ctx context.Context, t *turn, open time.Duration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if _, err := p.db.Exec(ctx, p.sql.open, t.downstream, t.scope, open.Microseconds()); err != nil {
		return
	}
	if p.cfg.Opened != nil {
		p.cfg.Opened(t.downstream, open)
	}
}

// takeSlot claims a free slot of t's concurrency, looking again after a
// jittered pause that doubles, until t may wait no longer.
func (p *Pacer) takeSlot(ctx context.Context, t *turn) (uuid.UUID, error) {
	holder := uuid.New()
	pause := slotPollMin
	for {
		ok, err := p.claimSlot(ctx, t, holder)
		if err != nil || ok {
			return holder, err
		}
		left := t.left()
		if left <= 0 {
			return holder, deferFor(t.downstream, t.scope, false, t.limit/2+rand.N(t.limit/2+1))
		}
		t.waited = true
		if err := p.sleep(ctx, min(pause/2+rand.N(pause/2+1), left)); err != nil {
			return holder, err
		}
		pause = min(pause*2, slotPollMax)
	}
}

// claimSlot claims a free slot for holder; when none is free, it makes the
// Pace's slots (the first call to a downstream, a raised limit) and tries
// once more.
func (p *Pacer) claimSlot(ctx context.Context, t *turn, holder uuid.UUID) (bool, error) {
	for range 2 {
		t.claimSent = time.Now()
		err := p.db.QueryRow(ctx, p.sql.claim, t.downstream, t.scope, t.pace.Concurrency, holder, t.lease.Microseconds()).Scan(new(int))
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return false, fmt.Errorf("pace %s: claim a slot: %w", t.downstream, p.notMigrated(err))
		}
		made, err := p.db.Exec(ctx, p.sql.slots, t.downstream, t.scope, t.pace.Concurrency)
		if err != nil {
			return false, fmt.Errorf("pace %s: make slots: %w", t.downstream, p.notMigrated(err))
		}
		if made.RowsAffected() == 0 {
			return false, nil
		}
	}
	return false, nil
}

// keepSlot renews holder's slot every third of its lease while the call
// runs, and returns the call's context, cancelled if the slot may be lost
// (another call may hold it by then), and a stop that gives the slot back.
// The slot may be lost when a renewal finds it taken, or when no renewal
// succeeded for all but 1/slotMargin of its lease, counted from when the last
// successful claim or renewal was sent (no later than the database clock
// stamped it), however long a renewal waits for a connection.
func (p *Pacer) keepSlot(ctx context.Context, t *turn, holder uuid.UUID) (context.Context, context.CancelFunc) {
	callCtx, cancel := context.WithCancelCause(ctx)
	lost := func() { cancel(fmt.Errorf("pace %s: %w", t.downstream, errSlotLost)) }
	kept := t.lease - t.lease/slotMargin
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(max(t.lease/3, time.Millisecond))
		defer tick.Stop()
		deadline := t.claimSent.Add(kept)
		expiry := time.NewTimer(time.Until(deadline))
		defer expiry.Stop()
		for {
			select {
			case <-callCtx.Done():
				return
			case <-expiry.C:
				lost()
				return
			case <-tick.C:
			}
			sent := time.Now()
			renewCtx, stop := context.WithDeadline(callCtx, deadline)
			tag, err := p.db.Exec(renewCtx, p.sql.renew, t.downstream, t.scope, holder, t.lease.Microseconds())
			stop()
			switch {
			case err == nil && tag.RowsAffected() == 1:
				deadline = sent.Add(kept)
				expiry.Reset(time.Until(deadline))
			case err == nil:
				lost()
				return
			}
		}
	}()
	return callCtx, func() {
		cancel(nil)
		<-done
		releaseCtx, stop := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer stop()
		_, _ = p.db.Exec(releaseCtx, p.sql.release, t.downstream, t.scope, holder) // else it frees at its lease's end
	}
}

// errSlotLost: a call's slot lease ran out while it ran.
var errSlotLost = errors.New("the call's slot was lost: its lease ran out")
