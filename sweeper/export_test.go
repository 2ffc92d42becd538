package sweeper

import "github.com/onceflow/onceflow/internal/dbschema"

// Statements for the default schema, for tests that read their plans.
var (
	DueSQL            = dbschema.Expand(dueSQL, dbschema.Default)
	ParkedSQL         = dbschema.Expand(parkedSQL, dbschema.Default)
	PruneKeysSQL      = dbschema.Expand(pruneKeysSQL, dbschema.Default)
	PruneOutboxSQL    = dbschema.Expand(pruneOutboxSQL, dbschema.Default)
	PruneProcessedSQL = dbschema.Expand(pruneProcessedSQL, dbschema.Default)
)
