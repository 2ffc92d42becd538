// Package workflow runs multi-step operations exactly once under an
// idempotency key, resumably.
//
// # Declaring a workflow
//
// A workflow is declared once with [Define], as a sequence of atomic phases
// ([phase.Atomic]: local writes in one transaction) and foreign mutations
// ([github.com/onceflow/onceflow/foreign.Mutation]: calls to other systems with a derived downstream
// key), plus the response built from the final state
// ([Workflow.Finish]):
//
//	var Checkout = workflow.Define("checkout",
//		phase.Atomic("create_order", createOrder),
//		foreign.Mutation("charge", charge),
//		phase.Atomic("record_charge", recordCharge),
//	).Finish(func(s *State) workflow.Response { return workflow.JSON(201, s) })
//
// # Running it
//
// [Workflow.Run] (Checkout.Run(ctx, engine, key, req), where req has the
// workflow's request type, so another type does not compile) claims the
// key and walks the state machine: a new key runs from the first step; a
// retry of a finished key gets the stored response, verbatim; a retry that
// finds the key's lease expired takes it over with a new owner token and
// resumes after the last committed step (the recovery point). [Engine.Resume] does the same from the stored request when the
// client is gone (sweeper.Completer calls it). [KeyOf] derives a key from
// business identity, for jobs whose intent outlives a process.
//
// # What commits when
//
// Each atomic phase commits its writes, the recovery point and the state in
// one transaction fenced by the owner token. The claim folds into the first
// phase's transaction, the completion into the last one's, and a foreign
// mutation's result into the next phase's. So a workflow of N atomic phases
// that starts and ends with one, and has no two foreign mutations in a row,
// commits N transactions, as its business writes alone would. Each commit
// with no phase to fold into adds one: the claim before a first foreign
// mutation, the completion after a last one, and the result of a foreign
// mutation followed by another. A replay writes nothing (when the first step
// is foreign, its claim is one read-only statement). A retry that takes over
// a record past its first step commits the takeover on its own, and Resume
// reads the record before taking it over.
//
// # Outcomes
//
// Steps end a workflow early with [Respond] (a business outcome such as a
// declined card, stored and replayed) or [Reject] (a validation failure
// before anything was committed: no record is kept and the client may retry
// at once). Any other error, or a panic, releases the lease with the record
// kept at its recovery point and returns a [StepError]; after
// [Config].MaxAttempts such attempts the key fails terminally with a stored
// 500. The table of every outcome, and how leases are kept, are in
// docs/workflows.md
// (https://github.com/onceflow/onceflow/blob/main/docs/workflows.md).
package workflow
