package sweeper

import (
	"context"

	"github.com/onceflow/onceflow/outbox"
)

// RelayTask runs an outbox relay as a sweeper task named "relay".
func RelayTask(r *outbox.Relay) Task { return relayTask{r} }

type relayTask struct{ relay *outbox.Relay }

func (t relayTask) Name() string { return "relay" }

func (t relayTask) Run(ctx context.Context) error {
	_, err := t.relay.RunOnce(ctx)
	return err
}
