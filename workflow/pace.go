package workflow

import (
	"log/slog"
	"time"

	"github.com/onceflow/onceflow/foreign"
)

// newPacer builds the pacer of Config.Pacing, in the engine's schema,
// reporting to the engine's logger and observer.
func (e *Engine) newPacer(db DB, limits map[string]foreign.Pace) (*foreign.Pacer, error) {
	return foreign.NewPacer(db, foreign.PacerConfig{
		Schema: e.store.Schema(),
		Limits: limits,
		Waited: func(downstream string, waited time.Duration) {
			if e.observer != nil {
				e.observer.PaceWaited(downstream, waited)
			}
		},
		Opened: func(downstream string, open time.Duration) {
			e.logger.Warn("a downstream asked every call to wait; its circuit is open",
				slog.String("downstream", downstream), slog.Duration("open", open))
			if e.observer != nil {
				e.observer.CircuitOpened(downstream, open)
			}
		},
		Deferred: func(downstream string, w *foreign.WaitError) {
			e.logger.Info("a paced call's turn is too far off; its key is deferred",
				slog.String("downstream", downstream), slog.String("tenant", w.Tenant),
				slog.Bool("circuit", w.Circuit), slog.Duration("wait", w.Wait))
			if e.observer != nil {
				e.observer.PaceDeferred(downstream)
			}
		},
	})
}
