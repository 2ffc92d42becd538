package lease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/lease"
	"github.com/onceflow/onceflow/recovery"
)

// TestRenewsEveryThird: while work is held, the lease is renewed about
// every third of it, and the work is not stopped.
func TestRenewsEveryThird(t *testing.T) {
	const l = 300 * time.Millisecond
	var renewals atomic.Int32
	k := lease.New(l, time.Now(), func(context.Context) (time.Time, error) {
		renewals.Add(1)
		return time.Now().Add(l), nil
	}, nil)
	ctx, stop := k.Hold(context.Background())
	select {
	case <-ctx.Done():
		t.Fatalf("the work was stopped: %v", context.Cause(ctx))
	case <-time.After(3 * l):
	}
	require.NoError(t, stop())
	require.GreaterOrEqual(t, renewals.Load(), int32(4), "renewed about every third of the lease")
}

// TestStopsWhenRenewalsFail: with every renewal failing, the work is
// stopped before a whole lease has passed since the last extension, and
// the cause says why.
func TestStopsWhenRenewalsFail(t *testing.T) {
	const l = 300 * time.Millisecond
	sent := time.Now()
	k := lease.New(l, sent, func(context.Context) (time.Time, error) {
		return time.Time{}, errors.New("connection refused")
	}, nil)
	ctx, stop := k.Hold(context.Background())
	<-ctx.Done()
	require.Less(t, time.Since(sent), l, "stopped before the lease ended")
	err := stop()
	require.ErrorIs(t, err, recovery.ErrLeaseLost)
	require.ErrorContains(t, err, "connection refused")
}

// TestTheMeasureSpansHolds: a second hold does not restart the measure: it
// runs from the last extension, not from the hold's start.
func TestTheMeasureSpansHolds(t *testing.T) {
	const l = 300 * time.Millisecond
	sent := time.Now()
	k := lease.New(l, sent, func(context.Context) (time.Time, error) {
		return time.Time{}, errors.New("connection refused")
	}, nil)
	_, stop := k.Hold(context.Background())
	time.Sleep(l / 2)
	require.NoError(t, stop())
	ctx, stop := k.Hold(context.Background())
	<-ctx.Done()
	require.Less(t, time.Since(sent), l, "the second hold ended within the first lease")
	require.ErrorIs(t, stop(), recovery.ErrLeaseLost)
}
