package pgproxy

import (
	"strings"
	"sync/atomic"
)

// Fault is what a rule does to the round trip of the statement it matches.
type Fault int

const (
	// LoseAcknowledgement lets the server run the round trip, then closes
	// the client's connection before any reply of it arrives.
	LoseAcknowledgement Fault = iota + 1
	// LoseRequest closes both connections before the statement reaches the
	// server.
	LoseRequest
)

func (f Fault) String() string {
	switch f {
	case LoseAcknowledgement:
		return "lost acknowledgement"
	case LoseRequest:
		return "lost request"
	}
	return "Fault(?)"
}

// Rule says which statement to fault and how.
type Rule struct {
	// Match reports whether the statement with this SQL text is the one to
	// fault. It runs under the proxy's lock, once for each statement a
	// client executes while the rule is armed: keep it quick, and do not
	// call the proxy from it. [Statement] and [Containing] build the usual
	// ones.
	Match func(sql string) bool
	Fault Fault
	// Skip is how many matching statements pass before the rule faults
	// one: 0 faults the first.
	Skip int
	// Times is how many matching statements the rule faults; 0 means 1.
	Times int
}

// Armed is a rule in force, and how often it has fired.
type Armed struct {
	rule  Rule
	skip  int // matches still to let pass, guarded by the proxy's lock
	left  int // matches still to fault, guarded by the proxy's lock
	fired atomic.Int64
}

// Fired returns how many times the rule has faulted a statement. A fault
// counts before the client's connection closes.
func (a *Armed) Fired() int { return int(a.fired.Load()) }

// Statement matches a statement whose whole text is sql, ignoring case and
// surrounding space: Statement("commit") matches "COMMIT" but not "begin
// isolation level read committed".
func Statement(sql string) func(string) bool {
	want := strings.TrimSpace(sql)
	return func(s string) bool { return strings.EqualFold(strings.TrimSpace(s), want) }
}

// Containing matches a statement whose text contains fragment, as written.
func Containing(fragment string) func(string) bool {
	return func(s string) bool { return strings.Contains(s, fragment) }
}
