// Package sweeper runs onceflow's background work on cron schedules:
// pruning finished records ([Pruner]), finishing work whose client went away
// ([Completer]), and delivering the outbox ([RelayTask]).
//
// A [Sweeper] ([New]) takes tasks and their schedules (standard five-field cron specs
// or descriptors such as "@every 10s"). [Sweeper.Start] returns at once; [Sweeper.Stop] cancels
// running tasks, waits for them and is safe to call twice. A run that is
// still going when its next turn comes is skipped, not doubled.
//
// Several sweepers may run at once, in one process or on many machines: a
// record is resumed by one of them, because the takeover is fenced; an
// outbox message is delivered at least once, and the consumer's
// outbox.Process makes its effect once; pruning skips rows another pruner
// holds.
package sweeper
