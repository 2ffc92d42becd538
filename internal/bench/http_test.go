package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHTTPLoadThroughClient runs the idemhttp case, briefly, on a
// throwaway server: both sides send through the idemclient.Client with
// no retry (a retry fails the case), and each gets a figure; never a
// speed.
func TestHTTPLoadThroughClient(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	report, err := Run(ctx, Config{Cases: []string{"idemhttp"}, NoFsync: true, Rounds: 1, Round: 200 * time.Millisecond})
	require.NoError(t, err)
	require.Len(t, report.Results, 3)
	for _, r := range report.Results {
		require.Positive(t, r.Onceflow, r.Figure)
		require.Positive(t, r.Floor, r.Figure)
	}
}
