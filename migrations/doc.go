// Package migrations creates and evolves onceflow's tables.
//
// The schema changes are numbered SQL files embedded in the binary (see
// sql/). A [Migrator] ([New], then [Migrator.Up]) applies them in order, each in its own transaction
// together with its row in the onceflow_migrations table, under a
// transaction-scoped advisory lock, so several processes may migrate the same
// database at once: one applies each step and the others find it done.
//
// Every table is qualified with the configured schema in every statement,
// never found through search_path, which connection poolers in transaction
// mode do not preserve. Use the same schema in [github.com/onceflow/onceflow/recovery.Config].
package migrations
