package sweeper

import "github.com/onceflow/onceflow/internal/dbschema"

// DueSQL is the completer's query for the default schema, for tests that
// read its plan.
var DueSQL = dbschema.Expand(dueSQL, dbschema.Default)

// PruneProcessedSQL is the pruner's statement for processed records, for
// the same tests.
var PruneProcessedSQL = dbschema.Expand(pruneProcessedSQL, dbschema.Default)
