package sleep_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/sleep"
)

func TestForReturnsNilWhenTheTimePassed(t *testing.T) {
	require.NoError(t, sleep.For(context.Background(), time.Millisecond))
}

func TestForReturnsTheContextsCause(t *testing.T) {
	cause := errors.New("stopped")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	require.ErrorIs(t, sleep.For(ctx, time.Hour), cause)
}
