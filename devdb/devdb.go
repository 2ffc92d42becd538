// Package devdb gives a program a PostgreSQL to run against while it is
// being developed or demonstrated: the one ONCEFLOW_DATABASE_URL names, or
// else a throwaway server started from the PostgreSQL server binaries
// installed on the machine (Debian/Ubuntu: apt-get install postgresql).
//
// A throwaway server lives in a private temporary directory, listens on a
// free loopback port, favours speed over durability (fsync off: it has
// nothing to keep) and is removed, data and all, by the stop function.
// It is not for production: give a deployed program its database's URL.
// Each process that calls URL without ONCEFLOW_DATABASE_URL gets a server
// of its own: to run two processes against one database (two instances
// behind a load balancer, say), start one and give both its URL in
// ONCEFLOW_DATABASE_URL.
package devdb

import (
	"context"

	"github.com/onceflow/onceflow/internal/pgcluster"
)

// URL returns the database URL in ONCEFLOW_DATABASE_URL when it is set,
// with a stop function that does nothing. Otherwise it starts a throwaway
// PostgreSQL server and returns its URL and the function that stops the
// server and removes it. Call stop before the program exits. It reports
// nothing: what it could not remove, like a server left behind by a killed
// program, is removed by the next URL call.
func URL(ctx context.Context) (url string, stop func(), err error) {
	if url := pgcluster.URLFromEnv(); url != "" {
		return url, func() {}, nil
	}
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		return "", nil, err
	}
	return cluster.URL(), func() { _ = cluster.Stop() }, nil
}
