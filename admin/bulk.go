package admin

import (
	"context"
	"errors"
	"fmt"

	"github.com/onceflow/onceflow/recovery"
)

// Kind names an action a bulk request applies.
type Kind string

const (
	KindRelease Kind = "release" // Release
	KindFail    Kind = "fail"    // Fail
	KindResume  Kind = "resume"  // ResumeNow
)

// Bulk asks for one action on every record a filter matches.
type Bulk struct {
	Action Kind
	// Filter selects the records, in its order from its Cursor; its Limit
	// is ignored: a bulk action takes at most Config.MaxBulk records.
	Filter Filter
	// Force and Reason are as in Action.
	Force  bool
	Reason string
}

// Report says what a bulk action did.
type Report struct {
	// Matched counts the records (messages) the filter matched, at most
	// Config.MaxBulk.
	Matched int `json:"matched"`
	// Done counts those the action changed.
	Done int `json:"done"`
	// Skipped lists those it left alone, and why: their lease is valid,
	// they changed since they were listed, or they finished.
	Skipped []Item `json:"skipped,omitempty"`
	// Errors lists those it could not act on for another reason; a
	// failure of the database's is logged, and its reason here says so,
	// as the single action's 500 does.
	Errors []Item `json:"errors,omitempty"`
	// More reports that the filter matches more than Config.MaxBulk:
	// run the action again for the rest.
	More bool `json:"more,omitempty"`
}

// Item is one record (or outbox message) of a Report, and why it is there.
type Item struct {
	Tenant  string `json:"tenant,omitempty"`
	Key     string `json:"key,omitempty"`
	Message int64  `json:"message,omitempty"`
	Reason  string `json:"reason"`
}

// Bulk applies b.Action to each record b.Filter matches, at most
// Config.MaxBulk, each fenced by the owner token listed with it: the
// records are listed first, then acted on one by one, so that a record
// the action moves in the listing's order is not taken twice.
func (a *Admin) Bulk(ctx context.Context, b Bulk) (*Report, error) {
	one, err := a.action(b.Action)
	if err != nil {
		return nil, err
	}
	if b.Filter.empty() {
		return nil, fmt.Errorf("%w: a bulk action needs a filter (a status, at least): an empty one would take every record", ErrInvalidInput)
	}
	recs, more, err := a.match(ctx, b.Filter)
	if err != nil {
		return nil, err
	}
	rep := &Report{Matched: len(recs), More: more}
	for _, r := range recs {
		key := recovery.Key{Tenant: r.Tenant, ID: r.Key}
		_, err := one(ctx, key, Action{Owner: r.Owner, Force: b.Force, Reason: b.Reason})
		a.add(rep, Item{Tenant: r.Tenant, Key: r.Key}, err)
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	return rep, nil
}

// empty reports a filter that matches every record.
func (f Filter) empty() bool {
	return f.Tenant == "" && f.Workflow == "" && f.Status == "" && f.StuckFor == 0 && f.CreatedFrom.IsZero() && f.CreatedTo.IsZero()
}

// add counts one item's outcome in rep. An error that is not one of the
// outcomes the API names (the database's) is shown as the single action's
// 500 is, without its text, which goes to the log.
func (a *Admin) add(rep *Report, it Item, err error) {
	switch {
	case err == nil:
		rep.Done++
	case errors.Is(err, ErrLeaseLive), errors.Is(err, ErrChanged), errors.Is(err, ErrFinished):
		it.Reason = err.Error()
		rep.Skipped = append(rep.Skipped, it)
	default:
		_, it.Reason = a.problem(err)
		rep.Errors = append(rep.Errors, it)
	}
}

// action returns the method that applies k to one record.
func (a *Admin) action(k Kind) (func(context.Context, recovery.Key, Action) (*Record, error), error) {
	switch k {
	case KindRelease:
		return a.Release, nil
	case KindFail:
		return a.Fail, nil
	case KindResume:
		return a.ResumeNow, nil
	}
	return nil, fmt.Errorf("%w: action must be release, fail or resume, not %q", ErrInvalidInput, k)
}

// match lists the records f matches, at most MaxBulk, and reports whether
// there are more.
func (a *Admin) match(ctx context.Context, f Filter) ([]Record, bool, error) {
	seen := map[recovery.Key]bool{}
	var recs []Record
	for {
		f.Limit = min(a.maxBulk-len(recs), LimitMax)
		page, err := a.List(ctx, f)
		if err != nil {
			return nil, false, err
		}
		for _, r := range page.Records {
			if k := (recovery.Key{Tenant: r.Tenant, ID: r.Key}); !seen[k] { // a record updated meanwhile can be listed twice
				seen[k] = true
				recs = append(recs, r)
			}
		}
		if page.Next == "" {
			return recs, false, nil
		}
		if len(recs) >= a.maxBulk {
			return recs, true, nil
		}
		f.Cursor = page.Next
	}
}

// BulkRetryDead retries each dead outbox message f matches (RetryDead),
// at most Config.MaxBulk.
func (a *Admin) BulkRetryDead(ctx context.Context, f DeadFilter) (*Report, error) {
	var msgs []int64
	more := false
	for {
		f.Limit = min(a.maxBulk-len(msgs), LimitMax)
		page, err := a.Dead(ctx, f)
		if err != nil {
			return nil, err
		}
		for _, m := range page.Messages {
			msgs = append(msgs, m.ID)
		}
		if page.Next == 0 {
			break
		}
		if len(msgs) >= a.maxBulk {
			more = true
			break
		}
		f.After = page.Next
	}
	rep := &Report{Matched: len(msgs), More: more}
	for _, id := range msgs {
		a.add(rep, Item{Message: id}, a.RetryDead(ctx, id))
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	return rep, nil
}
