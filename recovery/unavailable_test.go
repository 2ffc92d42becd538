package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/recovery"
)

// TestUnavailableTellsALostDatabaseFromARefusal: errors that say the
// database could not do the work are unavailable (503, retry); errors that
// say the work itself was refused are not.
func TestUnavailableTellsALostDatabaseFromARefusal(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("commit: %w", &pgconn.PgError{Code: code}) }
	unavailable := []error{
		fmt.Errorf("claim: %w", recovery.ErrUnavailable),
		pg("25006"), pg("08006"), pg("08001"), pg("57P01"), pg("57P02"), pg("57P03"),
		fmt.Errorf("read: %w", io.ErrUnexpectedEOF),
		&net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")},
	}
	for _, err := range unavailable {
		require.True(t, recovery.Unavailable(err), "%v", err)
	}
	refused := []error{nil, pg("23505"), pg("40001"), pg("42P01"), pg("57014"), context.Canceled, recovery.ErrMismatch, errors.New("provider said no")}
	for _, err := range refused {
		require.False(t, recovery.Unavailable(err), "%v", err)
	}
	require.True(t, recovery.ReadOnly(pg("25006")))
	require.False(t, recovery.ReadOnly(pg("08006")))
	require.False(t, recovery.ResetIfReadOnly(nil, pg("25006")), "nothing to reset")
}
