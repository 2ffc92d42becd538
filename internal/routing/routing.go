// Package routing checks that a statement onceflow sends could be routed to
// one node of a distributed PostgreSQL such as Citus, with tenant_id as the
// distribution column of onceflow_keys: the statement filters that table by
// tenant_id equality (or inserts with a tenant_id), or calls a onceflow
// function with the tenant as its first argument, the function's
// distribution argument. A statement that does not is a violation unless
// it is one of the maintenance scans listed in Maintenance, which Citus
// would run on every node.
//
// Check reads SQL as pgx sends it, with a small scanner rather than a
// parser: comments, string literals and quotes around identifiers go, a
// table counts where it is read or written (after FROM, JOIN, UPDATE,
// INTO, USING or a comma), and a tenant filter counts where no OR beside
// it can bypass it. Every table reference needs a filter of its own, so a
// second, unfiltered read of the table in the same statement is caught. A
// onceflow name Check does not know is a violation too, so that a new
// table or function is placed (see Tables and Functions) before it ships.
//
// Tracer applies Check to what a pool sends (package dbtest installs it in
// every test pool); the migrated functions' bodies are checked by this
// package's tests.
package routing

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Placement is where a distributed PostgreSQL would keep a onceflow table.
type Placement int

const (
	// ByTenant is a table distributed by tenant_id: every statement on it
	// filters tenant_id by equality.
	ByTenant Placement = iota + 1
	// Reference is a small table copied to every node: a read is local to
	// whichever node runs the statement, a write goes to every node.
	Reference
	// Coordinator is a table with no tenant column, kept on the coordinator
	// (a Citus local table): its statements run there, not routed by
	// tenant. Each entry says what that costs.
	Coordinator
)

// Tables places every onceflow table.
var Tables = map[string]Placement{
	// One row per (tenant, key): the table the claim and every transition
	// write, distributed by tenant so that a tenant's records, and the
	// business tables co-located with them, live on one node.
	"onceflow_keys": ByTenant,
	// Workflow definitions (migration 0010): a few rows per deploy, read by
	// every engine, keyed by workflow and fingerprint, not by tenant.
	"onceflow_definitions": Reference,
	// The outbox and what consumers processed have no tenant column: a
	// phase that enqueues writes the tenant's node and the coordinator in
	// one transaction (a two-phase commit), and the relay reads the
	// coordinator alone. Co-locating them needs a tenant column first.
	"onceflow_outbox":    Coordinator,
	"onceflow_processed": Coordinator,
	// Pacing (migration 0013): one row per downstream and scope, each
	// statement alone in autocommit, never inside a tenant's transaction.
	// Every statement names its downstream, so these could be distributed
	// by downstream instead; on the coordinator they cost a hop, no 2PC.
	"onceflow_pace":       Coordinator,
	"onceflow_pace_slots": Coordinator,
	// The migrator's version table: written only by migrations, which run
	// on the coordinator and propagate their DDL to every node.
	"onceflow_migrations": Coordinator,
}

// Routing is how a onceflow function routes.
type Routing int

const (
	// TenantArgument is a function that reads or writes onceflow_keys for
	// the tenant in its first argument: a distributed function with that
	// argument as its distribution argument, run on the tenant's node.
	TenantArgument Routing = iota + 1
	// Local is a function that touches no table: it runs wherever the
	// statement calling it runs.
	Local
)

// Functions places every onceflow function. The bodies are checked too
// (TestFunctionBodiesRouteByTenant), so a Local function that starts
// reading a table, or a TenantArgument one that reads another tenant's
// rows, is caught.
var Functions = map[string]Routing{
	"onceflow_claim":          TenantArgument,
	"onceflow_claim_deferred": TenantArgument,
	"onceflow_take_over":      TenantArgument,
	"onceflow_lock_key":       TenantArgument,
	"onceflow_may_take_over":  Local,
	"onceflow_history":        Local,
	"onceflow_lease_lost":     Local,
	// The check of a lent transaction's mark before its owner's COMMIT
	// (migration 0020): a transaction-local setting, no table.
	"onceflow_same_transaction": Local,
}

// Violation is a statement that would not route to one node.
type Violation struct {
	SQL     string
	Reasons []string
}

func (v *Violation) Error() string {
	return fmt.Sprintf("statement does not route by tenant (%s): %s", strings.Join(v.Reasons, "; "), v.SQL)
}

var (
	// name is a onceflow name, schema-qualified or not, once quotes are gone.
	name = regexp.MustCompile(`(?:\b[a-z_][a-z0-9_$]*\s*\.\s*)?\b(onceflow_[a-z0-9_]+)\b`)
	// tablePosition ends where a table is read or written.
	// (ONLY, LATERAL, a parenthesised join, and TABLE, TRUNCATE, COPY and
	// LOCK, which read or write the whole table, included.)
	tablePosition = regexp.MustCompile(`(?:\b(?:from|join|update|into|using|only|lateral|table|truncate|copy|lock)|,|\()\s*$`)
	// tenantEquals is tenant_id compared with one value: a parameter, the
	// functions' p_tenant argument or a literal (strings are '' by then).
	tenantValue  = `(?:\$\d+|p_tenant\b|'')(?:\s*::\s*text)?`
	tenantEquals = regexp.MustCompile(`(?:\b[a-z_][a-z0-9_]*\.)?\btenant_id\s*=\s*` + tenantValue +
		`|` + tenantValue + `\s*=\s*(?:\b[a-z_][a-z0-9_]*\.)?\btenant_id\b` +
		`|\(\s*(?:[a-z_][a-z0-9_]*\.)?tenant_id\s*,[^()]*\)\s*(?:=\s*\(\s*` + tenantValue +
		// An IN list of one row only: two rows may name two tenants.
		`|in\s*\(\s*\(\s*` + tenantValue + `[^()]*\)\s*\))`)
	// insertTenant is an INSERT naming tenant_id among its columns.
	insertTenant = regexp.MustCompile(`\binsert\s+into\s+\S+(?:\s+as\s+\S+)?\s*\([^()]*\btenant_id\b`)
	// firstArgument is a function call's first argument, up to a comma or
	// the closing parenthesis.
	firstArgument = regexp.MustCompile(`^\s*\(\s*([^,()]*)`)
	tenantArg     = regexp.MustCompile(`^` + tenantValue + `\s*$`)
	ddl           = regexp.MustCompile(`^\s*(?:create|alter|drop|comment|grant|revoke)\b`)
)

// Check returns nil when no statement in sql touches a onceflow table or
// function, or each that does routes by tenant, and otherwise a
// *Violation for each that does not (joined). DDL is not checked: Citus
// propagates a schema change to every node itself. Nor is a DO block's
// body, which only migrations send.
func Check(sql string) error {
	var errs []error
	for _, stmt := range statements(sql) {
		if v := checkStatement(stmt); v != nil {
			errs = append(errs, v)
		}
	}
	return errors.Join(errs...)
}

// checkStatement checks one statement.
func checkStatement(sql string) *Violation {
	s := normalize(sql)
	if ddl.MatchString(s) {
		return nil
	}
	var reasons []string
	tenantTables := 0
	for _, m := range name.FindAllStringSubmatchIndex(s, -1) {
		obj, end := s[m[2]:m[3]], m[1]
		if strings.HasPrefix(s[end:], "(") {
			reasons = append(reasons, checkCall(obj, s[end:])...)
			continue
		}
		if !tablePosition.MatchString(s[:m[0]]) {
			continue // a type, a savepoint, an index: not a read or write
		}
		switch place, ok := Tables[obj]; {
		case !ok:
			reasons = append(reasons, obj+" is not placed (routing.Tables)")
		case place == ByTenant:
			tenantTables++
		}
	}
	if filters := tenantFilters(s); tenantTables > filters {
		reasons = append(reasons, fmt.Sprintf("onceflow_keys is read or written %d times, filtered by tenant_id equality %d", tenantTables, filters))
	}
	if len(reasons) == 0 {
		return nil
	}
	return &Violation{SQL: sql, Reasons: reasons}
}

// checkCall checks a call of onceflow function fn with the text after its
// name, args.
func checkCall(fn, args string) []string {
	switch r, ok := Functions[fn]; {
	case !ok:
		return []string{fn + " is not placed (routing.Functions)"}
	case r == TenantArgument:
		m := firstArgument.FindStringSubmatch(args)
		if m == nil || !tenantArg.MatchString(m[1]) {
			return []string{fn + " is not called with the tenant as its first argument"}
		}
	}
	return nil
}

// tenantFilters counts the tenant equalities in s that no OR beside them
// bypasses, and the INSERTs that name tenant_id.
func tenantFilters(s string) int {
	n := len(insertTenant.FindAllStringIndex(s, -1))
	for _, m := range tenantEquals.FindAllStringIndex(s, -1) {
		if filterClause(s, m[0]) && !orBeside(s, m[0], m[1]) {
			n++
		}
	}
	return n
}

var clauseKeyword = regexp.MustCompile(`\b(?:where|on|having|set|select|values|when|then|else|returning|order|group|limit|from|join|using)\b`)

// filterClause reports whether s[at:] starts in a WHERE or ON clause: a
// comparison in a SET, a select list or a CASE filters no row.
func filterClause(s string, at int) bool {
	for at > 0 {
		open, depth := -1, 0
		for i := at - 1; i >= 0 && open < 0; i-- {
			switch s[i] {
			case ')':
				depth++
			case '(':
				if depth == 0 {
					open = i
				} else {
					depth--
				}
			}
		}
		before := flatten(s[open+1 : at])
		if ms := clauseKeyword.FindAllString(before, -1); ms != nil {
			last := ms[len(ms)-1]
			return last == "where" || last == "on"
		}
		at = open // none in this group: the clause of the group around it
	}
	return false
}

var (
	clauseStart = regexp.MustCompile(`\b(?:where|on|when|having|select)\b`)
	clauseEnd   = regexp.MustCompile(`\b(?:then|returning|order|group|limit|union|for|select|from|set)\b|;`)
	or          = regexp.MustCompile(`\bor\b`)
)

// orBeside reports whether the condition s[from:to] is one side of an OR:
// an OR in the same parenthesised group, within the same clause.
func orBeside(s string, from, to int) bool {
	start, end := group(s, from, to)
	flat := flatten(s[start:end])
	before, after := flat[:from-start], flat[to-start:]
	if ms := clauseStart.FindAllStringIndex(before, -1); ms != nil {
		before = before[ms[len(ms)-1][1]:]
	}
	if m := clauseEnd.FindStringIndex(after); m != nil {
		after = after[:m[0]]
	}
	return or.MatchString(before) || or.MatchString(after)
}

// group returns the bounds of the innermost parenthesised group around
// s[from:to], or the whole of s.
func group(s string, from, to int) (start, end int) {
	start, end = 0, len(s)
	for i, depth := from-1, 0; i >= 0; i-- {
		if s[i] == ')' {
			depth++
		} else if s[i] == '(' {
			if depth == 0 {
				start = i + 1
				break
			}
			depth--
		}
	}
	for i, depth := to, 0; i < len(s); i++ {
		if s[i] == '(' {
			depth++
		} else if s[i] == ')' {
			if depth == 0 {
				end = i
				break
			}
			depth--
		}
	}
	return start, end
}

// flatten blanks what nested parentheses in s hold, keeping offsets.
func flatten(s string) string {
	b := []byte(s)
	depth := 0
	for i, c := range b {
		switch {
		case c == '(':
			depth++
		case c == ')':
			depth--
		case depth > 0:
			b[i] = ' '
		}
	}
	return string(b)
}
