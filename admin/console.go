package admin

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/recovery"
)

// The console is server-rendered: each page is an html/template of
// console/, filled from the Go API, and console/static/console.js only
// opens the confirmation of an action and posts it to the JSON API. No
// build step; everything is embedded in the binary.

//go:embed console
var consoleFiles embed.FS

// consolePages are the console's pages, each parsed with the layout.
var consolePages = func() map[string]*template.Template {
	layout := template.Must(template.New("layout.html").Funcs(consoleFuncs).ParseFS(consoleFiles, "console/layout.html"))
	pages := map[string]*template.Template{}
	for _, name := range []string{"keys.html", "key.html", "outbox.html", "error.html"} {
		pages[name] = template.Must(template.Must(layout.Clone()).ParseFS(consoleFiles, "console/"+name))
	}
	return pages
}()

var consoleFuncs = template.FuncMap{
	"keyPath": func(tenant, key string) string {
		return "keys/" + pathSegment(tenant) + "/" + pathSegment(key)
	},
	"when": func(t any) string {
		switch t := t.(type) {
		case time.Time:
			return t.UTC().Format("2006-01-02 15:04:05 UTC")
		case *time.Time:
			if t != nil {
				return t.UTC().Format("2006-01-02 15:04:05 UTC")
			}
		}
		return ""
	},
	"ago": func(t time.Time) string { return roundAge(time.Since(t)) + " ago" },
	"json": func(raw json.RawMessage) string {
		var out bytes.Buffer
		if json.Indent(&out, raw, "", "  ") != nil {
			return string(raw)
		}
		return out.String()
	},
	"live": func(r Record) bool { return r.LockedUntil != nil && r.LockedUntil.After(time.Now()) },
}

// pathSegment is s escaped as one segment of a relative link. A tenant or
// key "." or ".." is escaped too: as it is, a browser would resolve it as
// a dot segment (keys/acme/.. is keys/), and the record's page and actions
// could not be reached from the console.
func pathSegment(s string) string {
	if s == "." || s == ".." {
		return strings.ReplaceAll(s, ".", "%2E")
	}
	return url.PathEscape(s)
}

// roundAge is d in its largest unit or two: "45s", "12m", "3h05m", "4d".
func roundAge(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

// mountConsole adds the console's pages to mux, at "/".
func (a *Admin) mountConsole(mux *http.ServeMux) {
	static, _ := fs.Sub(consoleFiles, "console/static") // a constant path in the embedded tree
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", a.pageKeys)
	mux.HandleFunc("GET /keys/{tenant}/{key}", a.pageKey)
	mux.HandleFunc("GET /outbox", a.pageOutbox)
}

// page is what every page's layout shows.
type page struct {
	Base  string // the console's root, for <base href>: the handler may be mounted under a prefix
	Title string
	Nav   string // the navigation entry to highlight
	Write bool   // the operator may act
	Data  any
}

// render writes the page name filled from p, with the headers that keep
// it from being framed or running scripts from elsewhere.
func (a *Admin) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	p.Base = consoleBase(r)
	p.Write = RoleOf(r.Context()) >= RoleWrite
	var buf bytes.Buffer
	if err := consolePages[name].Execute(&buf, p); err != nil {
		a.logger.ErrorContext(r.Context(), "admin: render the console", "page", name, "error", err)
		http.Error(w, "the page could not be rendered; the server's log says why", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; base-uri 'self'; frame-ancestors 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w) // the client went away
}

// consoleBase is the path the console is served under, ending in "/":
// the request's own path minus the part the handler sees (a prefix that
// http.StripPrefix took off).
func consoleBase(r *http.Request) string {
	u, err := url.ParseRequestURI(r.RequestURI)
	if err != nil {
		return "/"
	}
	base, ok := strings.CutSuffix(u.EscapedPath(), r.URL.EscapedPath())
	if !ok {
		return "/"
	}
	return base + "/"
}

// pageError renders err as the error page, with the status the JSON API
// would answer.
func (a *Admin) pageError(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	detail := failedDetail
	switch {
	case errors.Is(err, ErrInvalidInput):
		status, detail = http.StatusBadRequest, err.Error()
	case errors.Is(err, ErrNotFound), errors.Is(err, outbox.ErrNotFound):
		status, detail = http.StatusNotFound, err.Error()
	default:
		a.logger.ErrorContext(r.Context(), "admin: console page failed", "path", r.URL.Path, "error", err)
	}
	a.render(w, r, status, "error.html", page{Title: http.StatusText(status), Data: detail})
}

// keysPage is the data of the listing.
type keysPage struct {
	Query    url.Values // the filter as the form shows it
	Newest   bool       // the order the listing is in
	Statuses []recovery.Status
	Records  []Record
	Next     string // the query of the next page; "" on the last
	// Bulk is the listing's filter as a bulk action's body takes it
	// (JSON); "" when the listing has no filter, which a bulk action
	// refuses.
	Bulk    string
	MaxBulk int
}

// consoleFilter is the listing's query as parseFilter reads it: the
// form's empty fields dropped, and its datetime-local times (UTC) made
// RFC 3339.
func consoleFilter(q url.Values) url.Values {
	out := url.Values{}
	for name := range q {
		v := strings.TrimSpace(q.Get(name))
		if v == "" {
			continue
		}
		if name == "created_from" || name == "created_to" {
			if t, err := time.Parse("2006-01-02T15:04", v); err == nil {
				v = t.Format(time.RFC3339)
			}
		}
		out.Set(name, v)
	}
	return out
}

func (a *Admin) pageKeys(w http.ResponseWriter, r *http.Request) {
	q := consoleFilter(r.URL.Query())
	if !q.Has("newest") && !q.Has("stuck_for") {
		q.Set("newest", "true") // recent work first, unless looking for stuck work
	}
	f, err := parseFilter(q, true)
	if err != nil {
		a.pageError(w, r, err)
		return
	}
	list, err := a.List(r.Context(), f)
	if err != nil {
		a.pageError(w, r, err)
		return
	}
	data := keysPage{Query: r.URL.Query(), Newest: f.Newest, Records: list.Records, Statuses: []recovery.Status{
		recovery.StatusInFlight, StatusCompensating, recovery.StatusParked, recovery.StatusFailed,
		recovery.StatusCompensated, recovery.StatusCompleted,
	}}
	data.Bulk, data.MaxBulk = bulkFilter(q), a.maxBulk
	if list.Next != "" {
		q.Set("cursor", list.Next)
		data.Next = "?" + q.Encode()
	}
	a.render(w, r, http.StatusOK, "keys.html", page{Title: "Keys", Nav: nav(q), Data: data})
}

// bulkFilter is the filter of the listing's query q as a bulk action's
// body takes it, as JSON; "" when q selects no records in particular.
func bulkFilter(q url.Values) string {
	filter := map[string]string{}
	for name := range q {
		switch name {
		case "limit", "cursor", "newest":
		default:
			filter[name] = q.Get(name)
		}
	}
	if len(filter) == 0 {
		return ""
	}
	b, _ := json.Marshal(filter) // strings cannot fail to encode
	return string(b)
}

// nav names the navigation entry a listing's query is.
func nav(q url.Values) string {
	switch {
	case q.Get("stuck_for") != "":
		return "stuck"
	case q.Get("status") == string(recovery.StatusParked):
		return "parked"
	default:
		return "keys"
	}
}

// keyPage is the data of one record's page.
type keyPage struct {
	*Detail
	Timeline []event
	Finished bool
}

func (a *Admin) pageKey(w http.ResponseWriter, r *http.Request) {
	d, err := a.Show(r.Context(), pathKey(r))
	if err != nil {
		a.pageError(w, r, err)
		return
	}
	finished := d.Status == recovery.StatusCompleted || d.Status == recovery.StatusFailed || d.Status == recovery.StatusCompensated
	a.render(w, r, http.StatusOK, "key.html", page{Title: d.Key, Data: keyPage{Detail: d, Timeline: timeline(d), Finished: finished}})
}

// event is one point of a record's timeline.
type event struct {
	At     time.Time
	Kind   string // a recovery.TransitionKind, or "created", "last_error" for a record without history
	Step   string
	Owner  string // the owner token's first characters, "" when unknown
	Detail string
}

// timeline is what happened to the record, oldest first: its history
// (migration 0014), or for a record written before it, what its fields
// say: its creation, the step it last committed, its last error and how it
// finished.
func timeline(d *Detail) []event {
	if len(d.History) > 0 {
		events := make([]event, len(d.History))
		for i, tr := range d.History {
			events[i] = event{At: tr.At, Kind: string(tr.Kind), Step: tr.Step, Owner: tr.Owner.String()[:8], Detail: tr.Error}
		}
		return events
	}
	events := []event{{At: d.CreatedAt, Kind: "created"}}
	if d.RecoveryPoint != "" {
		events = append(events, event{At: d.UpdatedAt, Kind: "phase_committed", Step: d.RecoveryPoint})
	}
	if d.LastError != "" && d.CompletedAt == nil {
		events = append(events, event{At: d.UpdatedAt, Kind: "last_error", Detail: d.LastError})
	}
	if d.CompletedAt != nil {
		events = append(events, event{At: *d.CompletedAt, Kind: string(d.Status)})
	}
	return events
}

// outboxPage is the data of the dead letters' page.
type outboxPage struct {
	Topic    string
	Messages []outbox.Record
	Next     string
}

func (a *Admin) pageOutbox(w http.ResponseWriter, r *http.Request) {
	q := consoleFilter(r.URL.Query())
	f, err := parseDeadFilter(q, true)
	if err != nil {
		a.pageError(w, r, err)
		return
	}
	dead, err := a.Dead(r.Context(), f)
	if err != nil {
		a.pageError(w, r, err)
		return
	}
	data := outboxPage{Topic: f.Topic, Messages: dead.Messages}
	if dead.Next != 0 {
		q.Set("after", strconv.FormatInt(dead.Next, 10))
		data.Next = "outbox?" + q.Encode()
	}
	a.render(w, r, http.StatusOK, "outbox.html", page{Title: "Outbox dead letters", Nav: "outbox", Data: data})
}
