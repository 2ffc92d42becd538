package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
)

// ErrStopped reports a Halt or Resume of a cluster that Stop removed.
var ErrStopped = errors.New("pgcluster: the cluster was stopped and removed")

// Halt shuts the server down and keeps the cluster: its data directory,
// port and password stay, so that Resume starts the same server again and
// URL keeps working. The shutdown is PostgreSQL's fast one: every session
// ends, open transactions roll back, committed ones are kept. Until Resume,
// connections are refused, as when a database server restarts or fails
// over. Halting a halted cluster does nothing.
func (c *Cluster) Halt() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return ErrStopped
	}
	if c.server == nil {
		return nil
	}
	shutdown(c.server)
	c.server = nil
	c.logger.Info("throwaway PostgreSQL halted", slog.String("dir", c.dir))
	return nil
}

// Resume starts a halted cluster's server again, on the same data
// directory, port and password, and returns once it accepts connections.
// Resuming a running cluster does nothing. It fails if another process
// took the port while the server was down.
func (c *Cluster) Resume(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return ErrStopped
	}
	if c.server != nil {
		return nil
	}
	s, err := startServer(ctx, c.launch, c.url)
	if errors.Is(err, errPortTaken) {
		return fmt.Errorf("resume: port %d was taken while the server was down", c.launch.port)
	}
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	c.server = s
	c.logger.Info("throwaway PostgreSQL resumed", slog.String("dir", c.dir))
	return nil
}
