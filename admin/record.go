package admin

import (
	"encoding/base64"
	"encoding/json"
	"mime"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/recovery"
)

// Record is a key record as a listing shows it: where it is, and the owner
// token an action on it must present.
type Record struct {
	Tenant   string          `json:"tenant"`
	Key      string          `json:"key"`
	Workflow string          `json:"workflow"`
	Status   recovery.Status `json:"status"`
	// Compensating reports a record in flight whose compensations are
	// running.
	Compensating  bool   `json:"compensating,omitempty"`
	RecoveryPoint string `json:"recovery_point,omitempty"`
	Attempts      int    `json:"attempts"`
	LastError     string `json:"last_error,omitempty"`
	// Owner is the owner token read with the record: pass it to an
	// action (Action.Owner), which is refused if it changed since.
	Owner uuid.UUID `json:"owner"`
	// LockedUntil is when the lease ends by the database clock; nil when
	// the record holds no lease (finished, parked or released).
	LockedUntil *time.Time `json:"locked_until,omitempty"`
	// Released reports a record in flight whose lease was handed back:
	// the next claim or the completer takes it over.
	Released bool `json:"released,omitempty"`
	// NotBefore is the time before which nothing resumes a deferred
	// record; nil when it is not deferred.
	NotBefore   *time.Time `json:"not_before,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`
}

// Detail is one record in full, as Show returns it.
type Detail struct {
	Record
	// ID is the record's id, from which its derived downstream keys are
	// built.
	ID string `json:"id"`
	// Definition is the workflow definition that last ran the record; nil
	// for a middleware key or one made before migration 0010.
	Definition *Definition `json:"definition,omitempty"`
	// ResumeAs is the definition an operator chose to resume a parked
	// record under, if any.
	ResumeAs *Definition `json:"resume_as,omitempty"`
	// Undo lists the steps whose compensations are still to run (while
	// compensating) or were left when a compensation failed for good.
	Undo     []string        `json:"undo,omitempty"`
	Request  json.RawMessage `json:"request,omitempty"`
	State    json.RawMessage `json:"state,omitempty"`
	Response *Response       `json:"response,omitempty"`
	// TraceParent is the W3C traceparent of the request that created the
	// record (migration 0014), when it carried one.
	TraceParent string `json:"trace_parent,omitempty"`
	// History is the record's transitions, oldest first (the latest
	// recovery.MaxHistory); HistoryTruncated counts older ones dropped.
	History          []recovery.Transition `json:"history,omitempty"`
	HistoryTruncated int                   `json:"history_truncated,omitempty"`
}

// Definition names a workflow definition: its fingerprint, and its version
// label when the definition is stored.
type Definition struct {
	Fingerprint string `json:"fingerprint"`
	Version     string `json:"version,omitempty"`
}

// String is "VERSION (fingerprint FP)"; "none" for a record that names no
// definition (a middleware key, or one made before migration 0010).
func (d *Definition) String() string {
	switch {
	case d == nil:
		return "none"
	case d.Version == "":
		return "unknown version (fingerprint " + d.Fingerprint + ", not stored)"
	default:
		return d.Version + " (fingerprint " + d.Fingerprint + ")"
	}
}

// Response is a stored response.
type Response struct {
	Status int                 `json:"status"`
	Header map[string][]string `json:"header,omitempty"`
	// Body is the body itself when the response is JSON (its
	// Content-Type says so and it is valid), else the body as a string.
	Body json.RawMessage `json:"body,omitempty"`
	// BodyBase64 holds a body that is not UTF-8, in base 64.
	BodyBase64 string `json:"body_base64,omitempty"`
}

// summary is rec as a listing shows it.
func summary(rec *recovery.Record) Record {
	r := Record{
		Tenant: rec.Key.Tenant, Key: rec.Key.ID, Workflow: rec.Workflow, Status: rec.Status,
		Compensating: rec.Compensating(), RecoveryPoint: rec.RecoveryPoint, Attempts: rec.Attempts,
		LastError: rec.LastError, Owner: rec.Owner, Released: rec.Released,
		CreatedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt,
		LockedUntil: optional(rec.LockedUntil), NotBefore: optional(rec.NotBefore), CompletedAt: optional(rec.CompletedAt),
	}
	return r
}

// Describe returns rec in full, as Show does, naming its definitions by
// the versions defs store (recovery.Store.Definitions; a definition not
// among them is named by its fingerprint only). The onceflow command's
// keys show --json prints the same.
func Describe(rec *recovery.Record, defs []recovery.StoredDefinition) *Detail {
	d := &Detail{Record: summary(rec), ID: rec.ID.String(), Undo: rec.Undo, Request: rec.Request, State: rec.State,
		TraceParent: rec.TraceParent, History: rec.History, HistoryTruncated: rec.HistoryTruncated}
	definition := func(fingerprint string) *Definition {
		if fingerprint == "" {
			return nil
		}
		def := &Definition{Fingerprint: fingerprint}
		for _, sd := range defs {
			if sd.Workflow == rec.Workflow && sd.Fingerprint == fingerprint {
				def.Version = sd.Version
			}
		}
		return def
	}
	d.Definition, d.ResumeAs = definition(rec.Definition), definition(rec.ResumeAs)
	if rec.Response != nil {
		d.Response = response(rec.Response)
	}
	return d
}

// response is resp with its body shown as JSON, text or base 64.
func response(resp *recovery.Response) *Response {
	out := &Response{Status: resp.Status, Header: resp.Header}
	switch {
	case isJSON(resp.Header) && json.Valid(resp.Body):
		out.Body = resp.Body
	case utf8.Valid(resp.Body):
		out.Body, _ = json.Marshal(string(resp.Body)) // a string cannot fail to encode
	default:
		out.BodyBase64 = base64.StdEncoding.EncodeToString(resp.Body)
	}
	return out
}

// isJSON reports a Content-Type of JSON: application/json, or a +json type
// such as application/problem+json.
func isJSON(h map[string][]string) bool {
	media, _, err := mime.ParseMediaType(http.Header(h).Get("Content-Type"))
	return err == nil && (media == "application/json" || strings.HasSuffix(media, "+json"))
}

func optional(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
