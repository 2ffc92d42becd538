package admin

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/recovery"
)

// StatusCompensating selects, in a Filter, records in flight whose
// compensations are running. It is not a status a record is stored with:
// such a record is recovery.StatusInFlight, and Record.Compensating says
// so.
const StatusCompensating recovery.Status = "compensating"

// LimitDefault is the page size of a Filter whose Limit is 0.
const LimitDefault = 100

// LimitMax is the largest page.
const LimitMax = 1000

// Filter selects records. Zero fields match everything.
type Filter struct {
	Tenant   string
	Workflow string
	// Status is in_flight (compensating ones included), parked, failed,
	// compensated, completed, or StatusCompensating.
	Status recovery.Status
	// StuckFor selects records in flight that made no progress (no claim,
	// commit or release) for longer than this.
	StuckFor time.Duration
	// CreatedFrom and CreatedTo select records created at or after
	// CreatedFrom and before CreatedTo; a zero time leaves that end open.
	CreatedFrom time.Time
	CreatedTo   time.Time
	// Newest lists the most recently updated first (recent work); the
	// default is the least recently updated first (stuck work).
	Newest bool
	// Limit is the page size: 0 means LimitDefault; at most LimitMax.
	Limit int
	// Cursor continues a listing: a Page's Next. "" starts at the
	// beginning. A cursor belongs to the filter it was made with.
	Cursor string
}

// Page is one page of a listing.
type Page struct {
	Records []Record `json:"records"`
	// Next continues the listing after this page (Filter.Cursor); "" when
	// this page is the last.
	Next string `json:"next,omitempty"`
}

// validate checks f's status and sizes.
func (f Filter) validate() error {
	switch f.Status {
	case "", recovery.StatusInFlight, recovery.StatusParked, recovery.StatusFailed, recovery.StatusCompensated,
		recovery.StatusCompleted, StatusCompensating:
	default:
		return fmt.Errorf("%w: status must be in_flight, compensating, parked, failed, compensated or completed, not %q",
			ErrInvalidInput, f.Status)
	}
	if f.Limit < 0 || f.Limit > LimitMax {
		return fmt.Errorf("%w: limit %d is out of range (0 to %d)", ErrInvalidInput, f.Limit, LimitMax)
	}
	if err := checkText(map[string]string{"tenant": f.Tenant, "workflow": f.Workflow}); err != nil {
		return err
	}
	if f.StuckFor < 0 {
		return fmt.Errorf("%w: stuck_for must not be negative", ErrInvalidInput)
	}
	if f.StuckFor > 0 && f.StuckFor < time.Microsecond {
		// The database compares in microseconds: less would be 0, which
		// means no filter, and list every record.
		return fmt.Errorf("%w: stuck_for must be at least 1µs", ErrInvalidInput)
	}
	return nil
}

// checkText refuses a filter's text the database cannot hold (a NUL
// byte, invalid UTF-8): no record has it, and the query would fail, an
// operator's mistake answered as the server's (500). It checks no more
// than that, so that a record written under older input rules can still
// be found.
func checkText(fields map[string]string) error {
	for field, value := range fields {
		if !utf8.ValidString(value) || strings.ContainsRune(value, 0) {
			return fmt.Errorf("%w: %s %q is not valid UTF-8 text without NUL bytes", ErrInvalidInput, field, value)
		}
	}
	return nil
}

// listFilter is f as the store's listing takes it, limit records at most.
func (f Filter) listFilter(limit int) (recovery.ListFilter, error) {
	lf := recovery.ListFilter{
		Tenant: f.Tenant, Workflow: f.Workflow, Status: f.Status, StuckFor: f.StuckFor,
		CreatedFrom: f.CreatedFrom, CreatedTo: f.CreatedTo, Newest: f.Newest, Limit: limit,
	}
	if f.Status == StatusCompensating {
		lf.Status, lf.Compensating = recovery.StatusInFlight, true
	}
	if f.Cursor != "" {
		pos, err := decodeCursor(f.Cursor)
		if err != nil {
			return lf, err
		}
		lf.After = pos
	}
	return lf, nil
}

// List returns a page of the records f matches, least recently updated
// first (or newest first, f.Newest). Records updated while an operator
// pages move in the order: a later page may miss or repeat them.
func (a *Admin) List(ctx context.Context, f Filter) (*Page, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	limit := f.Limit
	if limit == 0 {
		limit = LimitDefault
	}
	lf, err := f.listFilter(limit + 1) // one more says whether a next page exists
	if err != nil {
		return nil, err
	}
	recs, err := a.store.List(ctx, lf)
	if err != nil {
		return nil, err
	}
	page := &Page{Records: make([]Record, 0, min(len(recs), limit))}
	for _, rec := range recs[:min(len(recs), limit)] {
		page.Records = append(page.Records, summary(rec))
	}
	if len(recs) > limit {
		page.Next = encodeCursor(recs[limit-1].Position())
	}
	return page, nil
}

// Show returns key's record in full, or ErrNotFound.
func (a *Admin) Show(ctx context.Context, key recovery.Key) (*Detail, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	rec, err := a.store.Load(ctx, key)
	if err != nil {
		return nil, err
	}
	var defs []recovery.StoredDefinition
	if rec.Definition != "" || rec.ResumeAs != "" {
		if defs, err = a.store.Definitions(ctx, rec.Workflow, ""); err != nil {
			return nil, err
		}
	}
	return Describe(rec, defs), nil
}

// cursor is a listing position as a Page's Next carries it.
type cursor struct {
	UpdatedAt time.Time `json:"u"`
	Tenant    string    `json:"t"`
	Key       string    `json:"k"`
}

func encodeCursor(p recovery.ListPosition) string {
	b, _ := json.Marshal(cursor{UpdatedAt: p.UpdatedAt, Tenant: p.Key.Tenant, Key: p.Key.ID}) // cannot fail
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (*recovery.ListPosition, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	var c cursor
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err == nil {
		err = checkText(map[string]string{"tenant": c.Tenant, "key": c.Key})
	}
	if err != nil || c.UpdatedAt.IsZero() {
		return nil, fmt.Errorf("%w: cursor %q is not one a page returned", ErrInvalidInput, s)
	}
	return &recovery.ListPosition{UpdatedAt: c.UpdatedAt, Key: recovery.Key{Tenant: c.Tenant, ID: c.Key}}, nil
}

// DeadFilter selects dead outbox messages. Zero fields match everything.
type DeadFilter struct {
	Topic string
	// After continues a listing: a DeadPage's Next. 0 starts at the
	// beginning.
	After int64
	// Limit is the page size: 0 means LimitDefault; at most LimitMax.
	Limit int
}

// DeadPage is one page of dead outbox messages, oldest first.
type DeadPage struct {
	Messages []outbox.Record `json:"messages"`
	// Next continues the listing after this page (DeadFilter.After); 0
	// when this page is the last.
	Next int64 `json:"next,omitempty"`
}

// Dead returns a page of the dead outbox messages f matches, oldest first.
func (a *Admin) Dead(ctx context.Context, f DeadFilter) (*DeadPage, error) {
	if f.Limit < 0 || f.Limit > LimitMax {
		return nil, fmt.Errorf("%w: limit %d is out of range (0 to %d)", ErrInvalidInput, f.Limit, LimitMax)
	}
	if err := checkText(map[string]string{"topic": f.Topic}); err != nil {
		return nil, err
	}
	limit := f.Limit
	if limit == 0 {
		limit = LimitDefault
	}
	msgs, err := a.outbox.List(ctx, a.db, outbox.Filter{Status: outbox.StatusDead, Topic: f.Topic, After: f.After, Limit: limit + 1})
	if err != nil {
		return nil, err
	}
	page := &DeadPage{Messages: msgs[:min(len(msgs), limit)]}
	if page.Messages == nil {
		page.Messages = []outbox.Record{}
	}
	if len(msgs) > limit {
		page.Next = msgs[limit-1].ID
	}
	return page, nil
}
