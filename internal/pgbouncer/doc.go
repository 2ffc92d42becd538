// Package pgbouncer starts a throwaway PgBouncer in transaction pooling mode
// in front of a PostgreSQL server, so that tests can prove onceflow works
// through one.
//
// It mirrors pgcluster: the bouncer lives in a private temporary directory
// (its configuration, password file, log and PID file), listens on a free
// loopback port, and Stop removes everything. When the process runs as
// root, PgBouncer runs as the "postgres" user (or "nobody"), because it
// refuses to run as root. If this process dies without calling Stop,
// PgBouncer gets SIGTERM and a later Start removes its directory.
//
// Transaction pooling gives each transaction whichever server connection is
// free, so nothing may outlive a transaction on the server side: no named
// prepared statements (PgBouncer 1.18 does not track them), no session
// SET, no session advisory locks, no LISTEN. URL returns connection strings
// that carry the pgx setting this needs (see QueryExecMode).
package pgbouncer
