package migrations_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/migrations"
)

// Migrate a database to the latest version on start-up. Several processes
// may do this at once.
func ExampleMigrator_Up() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("ONCEFLOW_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer db.Close()

	m, err := migrations.New(db, migrations.Config{Schema: "onceflow"})
	if err != nil {
		panic(err)
	}
	if _, err := m.Up(ctx); err != nil {
		panic(err)
	}
	version, err := m.Version(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(version == migrations.Latest())
	// Output: true
}
