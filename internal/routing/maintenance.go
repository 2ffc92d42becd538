package routing

import "strings"

// Scan is a statement that reads or writes onceflow_keys across tenants on
// purpose.
type Scan struct {
	// Name says what sends it.
	Name string
	// Fragment identifies the statement: a part of its text, in lower case
	// with runs of white space as one space, that no tenant's statement
	// has.
	Fragment string
	// Why says why it is a maintenance scan and what Citus would do with
	// it.
	Why string
}

// Maintenance lists the statements that scan onceflow_keys across tenants.
// Citus runs each on every node (a multi-shard query) and merges the
// results: fine for a sweeper's periodic batch or an operator's listing,
// never for a request's path. A scan that locks rows (FOR UPDATE SKIP
// LOCKED) or deletes by ctid would run per node instead (one sweeper per
// node, or run_command_on_shards), as Citus plans FOR UPDATE for
// single-shard queries only; docs/scaling.md has the plan. Citus is not
// available to test here: what it would do is read from its documentation.
var Maintenance = []Scan{
	{
		Name:     "sweeper.Completer: due records",
		Fragment: "row_number() over (partition by tenant_id order by due_at, key) as turn",
		Why: "finds the expired leases of every tenant to resume them, a turn per tenant; " +
			"each node would rank its own tenants' records (the ranking is per tenant, so no tenant spans nodes)",
	},
	{
		Name:     "sweeper.Completer: abandoned records",
		Fragment: "and not (workflow = any($1)) group by workflow",
		Why:      "counts expired records no known workflow resumes, for a gauge; every node counts its own, the coordinator sums",
	},
	{
		Name:     "sweeper.Completer: parked records",
		Fragment: "where status = 'parked' group by workflow",
		Why:      "counts parked records per workflow, for a gauge; every node counts its own, the coordinator sums",
	},
	{
		Name:     "sweeper.Completer: oldest in flight",
		Fragment: "min(created_at)), 0)::float8",
		Why:      "the age of the oldest record in flight, for a gauge; every node finds its own, the coordinator takes the oldest",
	},
	{
		Name:     "sweeper.Completer: oldest stuck",
		Fragment: "where status = 'in_flight' and locked_until < clock_timestamp() group by workflow",
		Why:      "the age of the oldest stuck record per workflow, for a gauge; every node finds its own, the coordinator merges",
	},
	{
		Name:     "sweeper.Pruner: finished and abandoned records",
		Fragment: "onceflow_keys where ctid = any (array(",
		Why: "deletes a batch of old records of every tenant (retention is not per tenant); " +
			"a ctid names a row within one shard, so the pruner would run on each node (per shard) rather than through the coordinator",
	},
	{
		Name:     "recovery.Store.List: operators' listing",
		Fragment: "where ($1 = '' or tenant_id = $1) and ($2 = '' or status = $2)",
		Why: "the admin console and `onceflow keys list` list records across tenants when no tenant is given; " +
			"every node returns its page and the coordinator merges them in order (with a tenant, it still goes to every node: the OR hides the filter from the planner)",
	},
	{
		Name:     "recovery.Store.Definitions: definitions in use",
		Fragment: "where k.workflow = d.workflow and k.status in ('in_flight', 'parked')",
		Why: "an operator's or deploy check's question, which stored definitions a record in flight or parked still uses; " +
			"a join of the reference table with every shard of onceflow_keys, run on every node",
	},
	{
		Name:     "migration 0012 down: compensated records become failed",
		Fragment: "set status = 'failed' where status = 'compensated'",
		Why: "a migration's one-off backfill of every tenant's records, run by an operator on the coordinator; " +
			"Citus runs the UPDATE on every node in one distributed transaction",
	},
}

// Listed returns the maintenance scan sql is, or nil.
func Listed(sql string) *Scan {
	s := strings.Join(strings.Fields(strings.ToLower(strings.ReplaceAll(sql, `"`, ""))), " ")
	for i := range Maintenance {
		if strings.Contains(s, Maintenance[i].Fragment) {
			return &Maintenance[i]
		}
	}
	return nil
}
