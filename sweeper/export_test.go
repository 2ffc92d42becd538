package sweeper

import "github.com/onceflow/onceflow/internal/dbschema"

// DueSQL is the completer's query for the default schema, for tests that
// read its plan.
var DueSQL = dbschema.Expand(dueSQL, dbschema.Default)
