// Package phase defines the steps a workflow is made of.
//
// A workflow alternates between two kinds of step. An atomic phase ([Atomic])
// makes local writes in one transaction, and the engine commits them
// together with the workflow's recovery point and state, fenced by the
// owner token: the writes and the record of them can never disagree. A
// foreign step ([Foreign], usually built with
// [github.com/onceflow/onceflow/foreign.Mutation]) calls another
// system outside any transaction; its result is committed at the next
// commit point.
//
// Every step function receives a *[Run]: the idempotency key, the request,
// and the workflow state, which the step may change. The state is saved as
// JSON at every commit, so a process that takes the key over after a crash
// continues with exactly the state of the last committed step.
package phase
