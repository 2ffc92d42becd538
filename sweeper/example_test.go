package sweeper_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/sweeper"
	"github.com/onceflow/onceflow/workflow"
)

type Shipment struct {
	Parcel string `json:"parcel"`
}

type Label struct {
	Tracking string `json:"tracking"`
}

// Finish work whose client went away. A shipment's label call fails while
// the carrier is down, and the client gives up; once the carrier is back, a
// run of the Completer resumes the shipment from its recovery point, and a
// retry of the client's key gets the stored response. In a service, a
// Sweeper runs the completer on a schedule, beside a Pruner:
//
//	s, err := sweeper.New(sweeper.Config{Tasks: []sweeper.Scheduled{
//		{Schedule: "@every 10s", Task: completer},
//		{Schedule: "@hourly", Task: pruner},
//	}})
//	err = s.Start(ctx)
//	defer s.Stop()
func ExampleCompleter() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("ONCEFLOW_DATABASE_URL")) // migrated with package migrations
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_shipments (parcel text PRIMARY KEY)`); err != nil {
		panic(err)
	}

	carrierUp := false
	ship := workflow.Define("ship",
		phase.Atomic("book", func(ctx context.Context, tx pgx.Tx, r *phase.Run[Shipment, Label]) error {
			_, err := tx.Exec(ctx, `INSERT INTO example_shipments VALUES ($1)`, r.Request.Parcel)
			return err
		}),
		foreign.Mutation("label", func(ctx context.Context, c *foreign.Call[Shipment, Label]) error {
			if !carrierUp {
				return errors.New("carrier unavailable")
			}
			c.State.Tracking = "trk_" + c.Request.Parcel
			return nil
		}),
	).Finish(func(l *Label) workflow.Response { return workflow.JSON(201, l) })
	// The completer resumes only workflows the engine knows.
	engine, err := workflow.NewEngine(db, workflow.Config{Workflows: []workflow.Definition{ship}})
	if err != nil {
		panic(err)
	}

	key := workflow.Key{Tenant: "acme", ID: "ship-p1"}
	_, err = ship.Run(ctx, engine, key, Shipment{Parcel: "p1"})
	fmt.Println("the client got:", err)
	carrierUp = true // and the client is gone

	completer, err := sweeper.NewCompleter(db, engine, sweeper.CompleterConfig{
		BackoffBase: -1, // resume failed records at once, for the example; the default backs off
	})
	if err != nil {
		panic(err)
	}
	if err := completer.Run(ctx); err != nil { // one round, as the sweeper runs it
		panic(err)
	}

	res, err := ship.Run(ctx, engine, key, Shipment{Parcel: "p1"})
	if err != nil {
		panic(err)
	}
	fmt.Println("a retry gets:", res.Response.Status, string(res.Response.Body), "replayed:", res.Replayed)
	// Output:
	// the client got: workflow ship: step label (attempt 1): carrier unavailable
	// a retry gets: 201 {"tracking":"trk_p1"} replayed: true
}
