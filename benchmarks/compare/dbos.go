package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

// shutdownTimeout bounds DBOS's shutdown.
const shutdownTimeout = 10 * time.Second

// dbosOrder is the DBOS workflow's input.
type dbosOrder struct {
	Key    string `json:"key"`
	Amount int64  `json:"amount"`
}

// newDBOS runs the checkout as a DBOS workflow in its cheapest durable form:
// the system database is the application's database (Config.SystemDBPool
// is the side's pool) and the data source is that same pool, so each
// dbos.RunAsTransaction writes the order and its step checkpoint in one
// transaction. The foreign call is a dbos.RunAsStep, which checkpoints its
// result, as a call to a payment provider would be. The workflow ID is the
// key: DBOS's idempotency key.
func newDBOS(ctx context.Context, db *database, _ int) (*side, error) {
	dctx, err := dbos.NewContext(ctx, dbos.Config{
		AppName:      "compare",
		SystemDBPool: db.pool,
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, fmt.Errorf("dbos context: %w", err)
	}
	ds, err := dbos.NewDataSource(dctx, db.pool, dbos.WithDataSourceName("orders"))
	if err != nil {
		_ = dbos.Shutdown(dctx, shutdownTimeout)
		return nil, fmt.Errorf("dbos data source: %w", err)
	}
	checkout := func(ctx dbos.Context, in dbosOrder) (int64, error) {
		id, err := dbos.RunAsTransaction(ctx, ds, func(ctx context.Context, tx dbos.Tx) (int64, error) {
			var id int64
			err := tx.QueryRow(ctx, insertOrder, in.Key, in.Amount).Scan(&id)
			return id, err
		}, dbos.WithStepName("create_order"))
		if err != nil {
			return 0, err
		}
		if _, err := dbos.RunAsStep(ctx, func(ctx context.Context) (bool, error) {
			return true, charge(ctx)
		}, dbos.WithStepName("charge")); err != nil {
			return 0, err
		}
		return dbos.RunAsTransaction(ctx, ds, func(ctx context.Context, tx dbos.Tx) (int64, error) {
			_, err := tx.Exec(ctx, markPaid, id)
			return id, err
		}, dbos.WithStepName("record_charge"))
	}
	dbos.RegisterWorkflow(dctx, checkout, dbos.WithWorkflowName("checkout"))
	if err := dbos.Launch(dctx); err != nil {
		_ = dbos.Shutdown(dctx, shutdownTimeout)
		return nil, fmt.Errorf("dbos launch: %w", err)
	}
	run := func(_ context.Context, key string) error {
		h, err := dbos.RunWorkflow(dctx, checkout, dbosOrder{Key: key, Amount: amount}, dbos.WithWorkflowID(key))
		if err != nil {
			return err
		}
		_, err = h.GetResult()
		return err
	}
	return &side{db: db, run: run, close: func() { _ = dbos.Shutdown(dctx, shutdownTimeout) }}, nil
}
