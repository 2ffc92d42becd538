package dbtest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { Main(m) }

func TestDatabasesAreMigratedAndIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := NewPool(t, 2), NewPool(t, 2)
	_, err := a.Exec(ctx, `INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, owner, locked_until)
		VALUES ('t', 'k', gen_random_uuid(), 'w', decode(repeat('00', 32), 'hex'), gen_random_uuid(), now())`)
	require.NoError(t, err, "the template is migrated")
	var inA, inB int
	require.NoError(t, a.QueryRow(ctx, `SELECT count(*) FROM onceflow_keys`).Scan(&inA))
	require.NoError(t, b.QueryRow(ctx, `SELECT count(*) FROM onceflow_keys`).Scan(&inB))
	require.Equal(t, 1, inA)
	require.Zero(t, inB, "another test's database does not see the row")

	empty := Connect(t, NewDatabase(t, Options{Unmigrated: true}), 1)
	var exists bool
	require.NoError(t, empty.QueryRow(ctx, `SELECT to_regclass('onceflow_keys') IS NOT NULL`).Scan(&exists))
	require.False(t, exists)
}

// TestPgBouncerRoute: with PgBouncerEnv=1 every URL dbtest hands out goes
// through PgBouncer (whose admin console sees the test's database) and
// DirectURL reaches the same database without it; otherwise both are the
// server's.
func TestPgBouncerRoute(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := NewDatabase(t, Options{Settings: map[string]string{"application_name": "dbtest_route"}})
	via := Connect(t, url, 1)
	direct := Connect(t, DirectURL(t, url), 1)
	var viaDB, directDB, app string
	require.NoError(t, via.QueryRow(ctx, `SELECT current_database(), current_setting('application_name')`).Scan(&viaDB, &app))
	require.NoError(t, direct.QueryRow(ctx, `SELECT current_database()`).Scan(&directDB))
	require.Equal(t, viaDB, directDB, "the same database either way")
	require.Equal(t, "dbtest_route", app, "Options.Settings are the database's defaults")

	b := PgBouncer()
	if os.Getenv(PgBouncerEnv) != "1" {
		require.Nil(t, b)
		require.Equal(t, url, DirectURL(t, url))
		return
	}
	require.NotNil(t, b)
	require.NotEqual(t, url, DirectURL(t, url))
	admin, err := pgx.Connect(ctx, b.AdminURL())
	require.NoError(t, err)
	defer admin.Close(ctx)
	rows, err := admin.Query(ctx, `SHOW CLIENTS`)
	require.NoError(t, err)
	seen := false
	for rows.Next() {
		values, err := rows.Values()
		require.NoError(t, err)
		for i, fd := range rows.FieldDescriptions() {
			if fd.Name == "database" && values[i] == viaDB {
				seen = true
			}
		}
	}
	require.NoError(t, rows.Err())
	require.True(t, seen, "PgBouncer serves a client of the test's database")
}

// TestSkewedDatabase: a skewed database's server reads the machine's clock
// plus the skew, in every session, and it is migrated; databases with the
// same skew share one server, apart from the tests' usual one.
func TestSkewedDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(skew.String(), func(t *testing.T) {
			t.Parallel()
			a := Connect(t, NewSkewedDatabase(t, skew, Options{}), 2)
			b := Connect(t, NewSkewedDatabase(t, skew, Options{}), 2)
			for _, db := range []*pgxpool.Pool{a, b} {
				var clock, txStart time.Time
				before := time.Now()
				require.NoError(t, db.QueryRow(ctx, `SELECT clock_timestamp(), now()`).Scan(&clock, &txStart))
				after := time.Now()
				for _, read := range []time.Time{clock, txStart} {
					require.WithinRange(t, read.Add(-skew), before.Add(-time.Second), after.Add(time.Second),
						"the server's clock is the machine's plus %s", skew)
				}
				var migrated bool
				require.NoError(t, db.QueryRow(ctx, `SELECT to_regclass('onceflow_keys') IS NOT NULL`).Scan(&migrated))
				require.True(t, migrated)
			}
			var dirA, dirB, dirMain string
			require.NoError(t, a.QueryRow(ctx, `SELECT current_setting('data_directory')`).Scan(&dirA))
			require.NoError(t, b.QueryRow(ctx, `SELECT current_setting('data_directory')`).Scan(&dirB))
			plain := Connect(t, DirectURL(t, NewDatabase(t, Options{})), 1)
			require.NoError(t, plain.QueryRow(ctx, `SELECT current_setting('data_directory')`).Scan(&dirMain))
			require.Equal(t, dirA, dirB, "one server per skew")
			require.NotEqual(t, dirMain, dirA, "not the tests' usual server")
		})
	}
}

// TestSkewedDatabaseNeedsFaketime: without libfaketime the error says how
// to install it; a skew that libfaketime cannot express is refused.
func TestSkewedDatabaseNeedsFaketime(t *testing.T) {
	defer func(saved []string) { faketimeLibraries = saved }(faketimeLibraries)
	faketimeLibraries = []string{filepath.Join(t.TempDir(), "*", "libfaketime.so.1")}
	_, err := skewedServerFor(42 * time.Second)
	require.ErrorIs(t, err, ErrNoFaketime)
	require.ErrorContains(t, err, "apt-get install faketime")

	_, err = skewedServerFor(1500 * time.Millisecond)
	require.ErrorContains(t, err, "not a whole number of seconds")
}
