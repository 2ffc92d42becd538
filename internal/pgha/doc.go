// Package pgha builds a real PostgreSQL high-availability formation on this
// machine, for tests of what a failover does to onceflow: a
// pg_auto_failover monitor and two data nodes on loopback ports, one the
// primary and one a hot standby that pg_auto_failover keeps synchronous.
//
// Each node is its pg_autoctl keeper, a child process in a process group
// of its own that runs the node's PostgreSQL. Kill ends a node as losing
// its machine would: the keeper and every PostgreSQL process of the node
// get SIGKILL at once, so nothing restarts it locally, and the monitor
// promotes the other node. Rejoin starts the keeper again, and
// pg_auto_failover rewinds the node (pg_rewind) and makes it the new
// primary's standby. The monitor's health checks run every half second, so
// a failover takes a few seconds, not the default's half minute.
//
// [Formation.URL] is a multi-host connection string with
// target_session_attrs=read-write, as an application behind
// pg_auto_failover uses: a client connects to whichever node takes writes.
// SetAsync and SetSync switch the standby between asynchronous and
// synchronous replication; PauseReplication holds back the WAL the primary
// sends, so that commits exist only on the primary, for tests of what an
// asynchronous failover loses.
//
// The formation lives in a private temporary directory that Stop removes.
// As with package pgcluster, the programs run as the "postgres" user when
// this process runs as root, keepers get a parent-death signal, and a later
// Start removes directories whose owner died without calling Stop. Every
// node trusts connections from loopback (no password): the formation is a
// throwaway for tests on one machine.
//
// It needs pg_auto_failover: its pg_autoctl command (Debian:
// pg-auto-failover-cli) and its extension for the PostgreSQL version found
// (Debian: postgresql-15-auto-failover for PostgreSQL 15).
package pgha
