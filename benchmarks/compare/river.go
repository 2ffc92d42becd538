package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// jobTimeout bounds the wait for one job to be worked.
const jobTimeout = 30 * time.Second

// checkoutArgs is the River job of one checkout.
type checkoutArgs struct {
	Key    string `json:"key"`
	Amount int64  `json:"amount"`
}

// Kind names the job kind.
func (checkoutArgs) Kind() string { return "checkout" }

// checkoutWorker does the checkout's two transactions, completing the job
// in the second (river.JobCompleteTx), and tells the waiting run.
type checkoutWorker struct {
	river.WorkerDefaults[checkoutArgs]
	pool    *pgxpool.Pool
	waiting sync.Map // key → chan error
}

// Work runs the checkout of one job.
func (w *checkoutWorker) Work(ctx context.Context, job *river.Job[checkoutArgs]) error {
	err := w.checkout(ctx, job)
	if ch, ok := w.waiting.LoadAndDelete(job.Args.Key); ok {
		ch.(chan error) <- err
	}
	return err
}

func (w *checkoutWorker) checkout(ctx context.Context, job *river.Job[checkoutArgs]) error {
	var id int64
	if err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, insertOrder, job.Args.Key, job.Args.Amount).Scan(&id)
	}); err != nil {
		return err
	}
	if err := charge(ctx); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, markPaid, id); err != nil {
			return err
		}
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
}

// newRiver runs the checkout as a River job per workflow: run inserts the
// job and waits until a worker of the same client has completed it. The
// client fetches at River's shortest cooldown (1 ms; the default, 100 ms,
// would cap a lone waiting caller at about ten jobs a second) and learns of
// new jobs by LISTEN/NOTIFY, as River does by default.
func newRiver(ctx context.Context, db *database, workers int) (*side, error) {
	driver := riverpgxv5.New(db.pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return nil, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("river migrations: %w", err)
	}
	worker := &checkoutWorker{pool: db.pool}
	workersReg := river.NewWorkers()
	if err := river.AddWorkerSafely(workersReg, worker); err != nil {
		return nil, err
	}
	client, err := river.NewClient(driver, &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers:       workersReg,
		FetchCooldown: river.FetchCooldownMin,
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	// The client works until close, whatever the context of the setup.
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, fmt.Errorf("river start: %w", err)
	}
	run := func(ctx context.Context, key string) error {
		done := make(chan error, 1)
		worker.waiting.Store(key, done)
		if _, err := client.Insert(ctx, checkoutArgs{Key: key, Amount: amount}, nil); err != nil {
			worker.waiting.Delete(key)
			return err
		}
		select {
		case err := <-done:
			return err
		case <-time.After(jobTimeout):
			worker.waiting.Delete(key)
			return errors.New("river: job " + key + " not worked within " + jobTimeout.String())
		case <-ctx.Done():
			worker.waiting.Delete(key)
			return ctx.Err()
		}
	}
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		_ = client.Stop(ctx)
	}
	return &side{db: db, run: run, close: stop}, nil
}
