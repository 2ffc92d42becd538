package child

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// FreePort returns a TCP port on the loopback interface that was free a
// moment ago. Another process may take it before the caller binds it.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WaitConnect returns once a PostgreSQL connection to url succeeds (the
// server, or PgBouncer, accepts connections). It fails when p exits first
// or when timeout passes.
func WaitConnect(ctx context.Context, p *Process, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		connCtx, connCancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(connCtx, url)
		connCancel()
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-p.Exited():
			return errors.New("exited during start")
		case <-ctx.Done():
			return fmt.Errorf("did not accept connections within %s: %w", timeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// LastLines returns the last n lines of out joined with " | ", to put a
// server log's end into one error message.
func LastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// RandomHex returns n random bytes in hex: a password for a throwaway
// server.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
