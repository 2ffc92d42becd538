package outbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/outbox"
)

func TestMain(m *testing.M) {
	if os.Getenv("OUTBOX_RELAY_HELPER") != "" {
		os.Exit(relayHelper())
	}
	dbtest.Main(m)
}

type bundle struct {
	ctx context.Context
	db  *pgxpool.Pool
	ob  *outbox.Outbox
}

func setup(t *testing.T) *bundle {
	t.Helper()
	t.Parallel()
	ob, err := outbox.New(outbox.Config{})
	require.NoError(t, err)
	b := &bundle{ctx: context.Background(), db: dbtest.NewPool(t, 16), ob: ob}
	_, err = b.db.Exec(b.ctx, `CREATE TABLE receipts (order_id text PRIMARY KEY, sent_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	return b
}

func (b *bundle) enqueue(t *testing.T, msgs ...outbox.Message) {
	t.Helper()
	require.NoError(t, pgx.BeginFunc(b.ctx, b.db, func(tx pgx.Tx) error { return b.ob.Enqueue(b.ctx, tx, msgs...) }))
}

func (b *bundle) list(t *testing.T, f outbox.Filter) []outbox.Record {
	t.Helper()
	got, err := b.ob.List(b.ctx, b.db, f)
	require.NoError(t, err)
	return got
}

func receipt(i int) outbox.Message {
	id := fmt.Sprintf("order-%d", i)
	return outbox.Message{Topic: "receipt", DedupeKey: "receipt:" + id, Payload: map[string]string{"order_id": id}}
}

// sendReceipt is a consumer that makes its effect once: the receipt row and
// the processed key commit together.
func sendReceipt(db *pgxpool.Pool, ob *outbox.Outbox) outbox.Handler {
	return func(ctx context.Context, m *outbox.Record) error {
		var p struct {
			OrderID string `json:"order_id"`
		}
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			return err
		}
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			_, err := ob.Process(ctx, tx, "receipts", m.DedupeKey, func() error {
				_, err := tx.Exec(ctx, `INSERT INTO receipts (order_id) VALUES ($1)`, p.OrderID)
				return err
			})
			return err
		})
	}
}

func TestEnqueueCommitsWithTheBusinessChange(t *testing.T) {
	b := setup(t)
	err := pgx.BeginFunc(b.ctx, b.db, func(tx pgx.Tx) error {
		if err := b.ob.Enqueue(b.ctx, tx, receipt(1)); err != nil {
			return err
		}
		return errors.New("the business change failed")
	})
	require.Error(t, err)
	require.Empty(t, b.list(t, outbox.Filter{}), "rolled back with the transaction")

	b.enqueue(t, receipt(1), receipt(2))
	got := b.list(t, outbox.Filter{})
	require.Len(t, got, 2)
	require.Equal(t, outbox.StatusPending, got[0].Status)
	require.JSONEq(t, `{"order_id":"order-1"}`, string(got[0].Payload))
	require.Equal(t, map[string]string{}, got[0].Headers)

	for _, bad := range []outbox.Message{
		{Topic: "", DedupeKey: "k", Payload: 1},
		{Topic: "t", DedupeKey: "", Payload: 1},
		{Topic: "t", DedupeKey: "k", Payload: json.RawMessage(`{not json`)},
		{Topic: "t", DedupeKey: "k", Payload: func() {}},
	} {
		err := pgx.BeginFunc(b.ctx, b.db, func(tx pgx.Tx) error { return b.ob.Enqueue(b.ctx, tx, bad) })
		require.ErrorIs(t, err, outbox.ErrInvalidInput)
	}
	require.Len(t, b.list(t, outbox.Filter{}), 2, "nothing written for bad input")
}

// TestEnqueueReportsDuplicates: a message whose topic and dedupe key are
// enqueued already is not written again, and the caller hears of it with an
// error that names it; the other messages are written, and the caller's
// transaction goes on and commits.
func TestEnqueueReportsDuplicates(t *testing.T) {
	b := setup(t)
	b.enqueue(t, receipt(1))
	again := receipt(1)
	again.Payload = map[string]string{"order_id": "something else"}
	sameKeyOtherTopic := outbox.Message{Topic: "sms", DedupeKey: again.DedupeKey, Payload: 1}
	var err error
	require.NoError(t, pgx.BeginFunc(b.ctx, b.db, func(tx pgx.Tx) error {
		err = b.ob.Enqueue(b.ctx, tx, receipt(2), again, sameKeyOtherTopic)
		_, execErr := tx.Exec(b.ctx, `INSERT INTO receipts (order_id) VALUES ('the business change')`)
		return execErr
	}), "the transaction was not aborted")
	require.ErrorIs(t, err, outbox.ErrDuplicate)
	var dup *outbox.DuplicateError
	require.ErrorAs(t, err, &dup)
	require.Equal(t, outbox.DuplicateError{Topic: "receipt", DedupeKey: "receipt:order-1"}, *dup)
	require.ErrorContains(t, err, `topic "receipt", dedupe key "receipt:order-1"`)

	got := b.list(t, outbox.Filter{})
	require.Len(t, got, 3, "the other messages were written")
	require.JSONEq(t, `{"order_id":"order-1"}`, string(got[0].Payload), "the first message stays as it was")
	require.Equal(t, "receipt:order-2", got[1].DedupeKey)
	require.Equal(t, "sms", got[2].Topic, "a dedupe key is unique per topic")
	require.Equal(t, 1, countRows(t, b, `SELECT count(*) FROM receipts`))
}

func TestRelayDeliversAndMarks(t *testing.T) {
	b := setup(t)
	b.enqueue(t, receipt(1), receipt(2), outbox.Message{Topic: "sms", DedupeKey: "sms:1", Payload: "hi",
		Headers: map[string]string{"to": "+44"}})
	relay, err := outbox.NewRelay(b.db, outbox.RelayConfig{Handlers: map[string]outbox.Handler{"receipt": sendReceipt(b.db, b.ob)}})
	require.NoError(t, err)
	stats, err := relay.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Delivered: 2}, stats)
	require.Len(t, b.list(t, outbox.Filter{Status: outbox.StatusDelivered}), 2)
	sms := b.list(t, outbox.Filter{Topic: "sms"})
	require.Len(t, sms, 1)
	require.Equal(t, outbox.StatusPending, sms[0].Status, "a topic without a handler here waits for another relay")
	require.Zero(t, sms[0].Attempts)
	require.Equal(t, map[string]string{"to": "+44"}, sms[0].Headers)

	stats, err = relay.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Zero(t, stats.Delivered, "nothing is delivered twice")
}

func TestRelayRetriesThenDeadLetters(t *testing.T) {
	b := setup(t)
	b.enqueue(t, receipt(1))
	var calls atomic.Int32
	var waits []int
	relay, err := outbox.NewRelay(b.db, outbox.RelayConfig{
		Handlers: map[string]outbox.Handler{"receipt": func(ctx context.Context, m *outbox.Record) error {
			if calls.Add(1) == 2 {
				panic("template missing")
			}
			return fmt.Errorf("smtp said 451 (attempt %d)", m.Attempts)
		}},
		MaxAttempts: 3,
		Backoff:     func(attempt int) time.Duration { waits = append(waits, attempt); return 0 },
	})
	require.NoError(t, err)
	for i, want := range []outbox.Stats{{Retried: 1}, {Retried: 1}, {Dead: 1}, {}} {
		stats, err := relay.RunOnce(b.ctx)
		require.NoError(t, err)
		require.Equal(t, want, stats, "run %d", i)
	}
	require.Equal(t, []int{1, 2}, waits, "backoff is asked per failed attempt")
	dead := b.list(t, outbox.Filter{Status: outbox.StatusDead})
	require.Len(t, dead, 1)
	require.Equal(t, 3, dead[0].Attempts)
	require.Contains(t, dead[0].LastError, "smtp said 451 (attempt 3)")

	require.NoError(t, b.ob.Retry(b.ctx, b.db, dead[0].ID))
	retried := b.list(t, outbox.Filter{})[0]
	require.Equal(t, outbox.StatusPending, retried.Status)
	require.Zero(t, retried.Attempts)
	require.ErrorIs(t, b.ob.Retry(b.ctx, b.db, 999), outbox.ErrNotFound)
}

func TestBackoffGrowsAndIsBounded(t *testing.T) {
	t.Parallel()
	for attempt, base := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 5: 16 * time.Second, 13: time.Hour, 100: time.Hour} {
		wait := outbox.Backoff(attempt)
		require.GreaterOrEqual(t, wait, base*8/10, "attempt %d", attempt)
		require.LessOrEqual(t, wait, base*12/10, "attempt %d", attempt)
	}
}

// TestRelaysShareWork: several relays over one outbox deliver every message,
// and none twice in the absence of failures.
func TestRelaysShareWork(t *testing.T) {
	b := setup(t)
	const messages = 500
	var msgs []outbox.Message
	for i := range messages {
		msgs = append(msgs, receipt(i))
	}
	b.enqueue(t, msgs...)
	var (
		mu    sync.Mutex
		calls = map[int64]int{}
	)
	handler := func(ctx context.Context, m *outbox.Record) error {
		mu.Lock()
		calls[m.ID]++
		mu.Unlock()
		return nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		relay, err := outbox.NewRelay(b.db, outbox.RelayConfig{Handlers: map[string]outbox.Handler{"receipt": handler}, BatchSize: 20})
		require.NoError(t, err)
		wg.Go(func() {
			_, err := relay.RunOnce(b.ctx)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, calls, messages)
	for id, n := range calls {
		require.Equal(t, 1, n, "message %d", id)
	}
	require.Len(t, b.list(t, outbox.Filter{Status: outbox.StatusDelivered, Limit: 1000}), messages)
}

func TestProcessMakesTheEffectOnce(t *testing.T) {
	b := setup(t)
	var ran atomic.Int32
	var wg sync.WaitGroup
	results := make(chan bool, 8)
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			errs <- pgx.BeginFunc(b.ctx, b.db, func(tx pgx.Tx) error {
				first, err := b.ob.Process(b.ctx, tx, "receipts", "receipt:order-1", func() error {
					ran.Add(1)
					_, err := tx.Exec(b.ctx, `INSERT INTO receipts (order_id) VALUES ('order-1')`)
					return err
				})
				results <- first
				return err
			})
		})
	}
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	firsts := 0
	for first := range results {
		if first {
			firsts++
		}
	}
	require.Equal(t, 1, firsts)
	require.EqualValues(t, 1, ran.Load())

	// Another consumer of the same message processes it on its own.
	var first bool
	require.NoError(t, pgx.BeginFunc(b.ctx, b.db, func(tx pgx.Tx) (err error) {
		first, err = b.ob.Process(b.ctx, tx, "analytics", "receipt:order-1", func() error { return nil })
		return err
	}))
	require.True(t, first)
}

// TestKilledRelayRedelivers: a relay process is killed mid-batch, after a
// consumer committed an effect but before the relay marked its message.
// Another relay takes the batch again once its lease ends; with Process,
// every receipt exists exactly once.
func TestKilledRelayRedelivers(t *testing.T) {
	b := setup(t)
	const messages = 12
	var msgs []outbox.Message
	for i := range messages {
		msgs = append(msgs, receipt(i))
	}
	b.enqueue(t, msgs...)

	helper := exec.Command(os.Args[0], "-test.run", "^$")
	helper.Env = append(os.Environ(), "OUTBOX_RELAY_HELPER="+b.db.Config().ConnString())
	stdout, err := helper.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, helper.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "stalled\n", line)
	require.NoError(t, helper.Process.Kill())
	_ = helper.Wait()

	delivered := len(b.list(t, outbox.Filter{Status: outbox.StatusDelivered}))
	require.Equal(t, 4, delivered, "the helper delivered four, then died holding the fifth")
	require.Equal(t, 5, countRows(t, b, `SELECT count(*) FROM receipts`), "the fifth receipt committed before the kill")

	// The dead relay's lease ends (without waiting it out).
	_, err = b.db.Exec(b.ctx, `UPDATE onceflow_outbox SET available_at = clock_timestamp() WHERE status = 'pending'`)
	require.NoError(t, err)
	relay, err := outbox.NewRelay(b.db, outbox.RelayConfig{Handlers: map[string]outbox.Handler{"receipt": sendReceipt(b.db, b.ob)}})
	require.NoError(t, err)
	stats, err := relay.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, messages-4, stats.Delivered, "the fifth is delivered again")
	require.Equal(t, messages, countRows(t, b, `SELECT count(*) FROM receipts`), "one receipt per order")
	require.Equal(t, messages, countRows(t, b, `SELECT count(*) FROM onceflow_processed`))
	require.Len(t, b.list(t, outbox.Filter{Status: outbox.StatusDelivered}), messages)
}

func countRows(t *testing.T, b *bundle, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(b.ctx, sql).Scan(&n))
	return n
}

// relayHelper runs a relay whose consumer stalls after committing the
// fifth receipt, and waits there to be killed.
func relayHelper() int {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("OUTBOX_RELAY_HELPER"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ob, _ := outbox.New(outbox.Config{})
	consume := sendReceipt(db, ob)
	var n int
	relay, err := outbox.NewRelay(db, outbox.RelayConfig{BatchSize: 8, Handlers: map[string]outbox.Handler{
		"receipt": func(ctx context.Context, m *outbox.Record) error {
			if err := consume(ctx, m); err != nil {
				return err
			}
			if n++; n == 5 {
				fmt.Println("stalled")
				select {} // killed here
			}
			return nil
		},
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, strings.TrimSpace(err.Error()))
		return 1
	}
	_, _ = relay.RunOnce(ctx)
	return 0
}

// TestBatchOutlivingItsLease: handlers slower than the lease allows for a
// whole batch; the relay gives back what it cannot deliver in time, another
// relay shares the work, and every delivery is recorded once. A handler's
// work is a quarter of the lease and its timeout half of it: a batch needs
// a lease and a half. A delivery cut short by the batch's lease is tried
// again, as often as a loaded machine makes it take (running out of
// attempts is not what this test is about).
func TestBatchOutlivingItsLease(t *testing.T) {
	b := setup(t)
	const (
		messages = 6
		lease    = time.Second
	)
	var msgs []outbox.Message
	for i := range messages {
		msgs = append(msgs, receipt(i))
	}
	b.enqueue(t, msgs...)
	consume := sendReceipt(b.db, b.ob)
	slow := func(ctx context.Context, m *outbox.Record) error {
		select {
		case <-time.After(lease / 4): // the handler's work
		case <-ctx.Done():
			return ctx.Err()
		}
		return consume(ctx, m)
	}
	cfg := outbox.RelayConfig{Handlers: map[string]outbox.Handler{"receipt": slow}, BatchSize: messages,
		Lease: lease, HandlerTimeout: lease / 2, MaxAttempts: math.MaxInt32, Backoff: func(int) time.Duration { return 0 }}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total outbox.Stats
	)
	for range 2 {
		relay, err := outbox.NewRelay(b.db, cfg)
		require.NoError(t, err)
		wg.Go(func() {
			for {
				stats, err := relay.RunOnce(b.ctx)
				mu.Lock()
				total.Delivered += stats.Delivered
				mu.Unlock()
				pending, lerr := b.ob.List(b.ctx, b.db, outbox.Filter{Status: outbox.StatusPending})
				if err != nil || lerr != nil || len(pending) == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, messages, total.Delivered, "each delivery is recorded once, by the relay holding the message")
	require.Equal(t, messages, countRows(t, b, `SELECT count(*) FROM receipts`))
	require.Len(t, b.list(t, outbox.Filter{Status: outbox.StatusDelivered}), messages)
}

func TestRetryLeavesMessagesBeingDeliveredAlone(t *testing.T) {
	b := setup(t)
	b.enqueue(t, receipt(1))
	entered, release := make(chan struct{}), make(chan struct{})
	relay, err := outbox.NewRelay(b.db, outbox.RelayConfig{Handlers: map[string]outbox.Handler{"receipt": func(context.Context, *outbox.Record) error {
		close(entered)
		<-release
		return nil
	}}})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { _, err := relay.RunOnce(b.ctx); done <- err }()
	<-entered
	id := b.list(t, outbox.Filter{})[0].ID
	require.ErrorIs(t, b.ob.Retry(b.ctx, b.db, id), outbox.ErrNotFound, "a message in delivery is not revived")
	close(release)
	require.NoError(t, <-done)
	require.Len(t, b.list(t, outbox.Filter{Status: outbox.StatusDelivered}), 1)
}
