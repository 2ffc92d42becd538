package recovery

// Schema returns the schema that holds the store's tables, so that a
// component built from the store (or from an engine, through
// workflow.Engine.Store) reads the same tables without being told again.
func (s *Store) Schema() string { return s.schema }
