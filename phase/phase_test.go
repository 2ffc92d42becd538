package phase_test

import (
	"context"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/phase"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestPanicsBecomeErrors(t *testing.T) {
	t.Parallel()
	step := phase.Foreign("call", func(context.Context, *phase.Run[int, int]) error { panic(io.ErrUnexpectedEOF) })
	err := seam.StepOf(step).RunForeign(context.Background(), &phase.Run[int, int]{})
	var panicErr *phase.PanicError
	require.ErrorAs(t, err, &panicErr)
	require.Equal(t, "call", panicErr.Step)
	require.NotEmpty(t, panicErr.Stack)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "a panic(err) unwraps to err")

	atomic := phase.Atomic("write", func(context.Context, pgx.Tx, *phase.Run[int, int]) error { panic("boom") })
	err = seam.StepOf(atomic).RunAtomic(context.Background(), nil, &phase.Run[int, int]{})
	require.ErrorAs(t, err, &panicErr)
	require.Equal(t, "boom", panicErr.Value)
	require.Equal(t, "step write panicked: boom", err.Error())
}

func TestRunKnowsItsStep(t *testing.T) {
	t.Parallel()
	var seen string
	step := phase.Foreign("call", func(_ context.Context, r *phase.Run[int, int]) error {
		seen = r.Step
		r.State = r.Request * 2
		return nil
	})
	run := &phase.Run[int, int]{Request: 21}
	require.NoError(t, seam.StepOf(step).RunForeign(context.Background(), run))
	require.Equal(t, "call", seen)
	require.Equal(t, 42, run.State)
}

func TestValid(t *testing.T) {
	t.Parallel()
	noop := func(context.Context, pgx.Tx, *phase.Run[int, int]) error { return nil }
	require.NoError(t, seam.StepOf(phase.Atomic("ok", noop)).Valid())
	require.Error(t, seam.StepOf(phase.Atomic("", noop)).Valid())
	require.Error(t, seam.StepOf(phase.Atomic("tab\tname", noop)).Valid())
	require.Error(t, seam.StepOf(phase.Atomic[int, int]("nil", nil)).Valid())
	require.Error(t, seam.StepOf(phase.Foreign[int, int]("nil", nil)).Valid())
	require.Equal(t, "atomic", phase.KindAtomic.String())
	require.Equal(t, "foreign", phase.KindForeign.String())
}
