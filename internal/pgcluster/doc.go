// Package pgcluster starts a throwaway PostgreSQL cluster from the server
// binaries installed on the machine, for tests, the demo and benchmarks.
//
// A cluster lives in a private temporary directory: initdb writes the data
// directory there, the server listens on a free loopback port and keeps its
// Unix socket in the same directory, and Stop removes everything. Halt and
// Resume stop the server and start it again on the same data directory,
// port and password, for tests of what a database restart does to its
// clients. When the process runs as root, the server runs as the "postgres"
// user, because PostgreSQL refuses to run as root.
//
// Callers that were given a database URL (ONCEFLOW_DATABASE_URL, see
// URLFromEnv) should use it instead of starting a cluster.
package pgcluster
