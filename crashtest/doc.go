// Package crashtest proves that a workflow survives a process death at any
// point: for users' own workflows, against a real database.
//
// [Explore] runs the workflow once without crashing to learn its crash points
// ([workflow.CrashPoints]: before each step, after each foreign call before
// its result is committed, before and after each commit) and its response.
// Then, for every crash point and in a fresh world each time, it runs the
// workflow and stops the attempt at that point as a process death would (no
// lease release, no cleanup; an open transaction rolls back), expires the
// lease through a test hook instead of waiting it out, and recovers with a
// new engine: once as the client's retry would ([workflow.Workflow.Run]) and once as
// the sweeper would ([workflow.Engine.Resume]). It checks that the recovered response
// equals the uncrashed one and that the world's invariant holds. Then it
// wakes the stopped attempt, as a paused process that resumes after its
// lease was taken over: every write it tries to the key's record must be
// fenced out, and the invariant must still hold.
//
//	func TestCheckoutSurvivesCrashes(t *testing.T) {
//		crashtest.Run(t, crashtest.Case[Order, State]{
//			NewWorld: func(ctx context.Context) (*crashtest.World[Order, State], error) {
//				db := crashtest.FreshDatabase(t, "") // on $ONCEFLOW_DATABASE_URL's server
//				provider := newFakeProvider(t)
//				return &crashtest.World[Order, State]{
//					DB:       db,
//					Workflow: checkout(provider),
//					Check:    func(ctx context.Context) error { return exactlyOnce(ctx, db, provider) },
//					Close:    db.Close,
//				}, nil
//			},
//			Request: Order{Amount: 1999},
//		})
//	}
//
// [Upgrade] ([ExploreUpgrade] outside a test) proves a deploy of a changed
// workflow to the records in flight. Given the deployed definition
// (World.Workflow) and the next release's (World.Next), it stops each at
// each of its crash points and recovers under the other, in a new process
// that registers that one alone: the deploy, and the other direction of a
// rolling deploy, where a process of the old release takes over a record
// the new one wrote. A recovery passes when it finishes the work with the
// uncrashed response of the definition that finished it, or parks the
// record ([workflow.ErrParked]) and an operator's resume as the definition
// that wrote it ([workflow.Engine.ResumeAs]) then finishes it; the
// invariant must hold either way. [Report.Parked] and [Report.Resumed] say
// where each direction parked, so that a test can assert that a change
// parks exactly where the rules say and nowhere else.
//
// FreshDatabase (or Databases, outside a test) gives each world a database
// of its own, migrated with package migrations and dropped at the end, on a
// server whose user may CREATE DATABASE.
//
// # Compensation
//
// A workflow's compensations (foreign.Compensate) run only when it fails
// for good before its point of no return, so a Case explores them when its
// world makes that happen: a fake that refuses, a phase that returns a
// phase.Permanent error. The uncrashed run then passes the forward
// path's crash points up to the failure and the compensation path's
// ([workflow.CompensationPoints]: before each compensation, after its
// call, after its commit), and every one is crashed at with both
// recoveries. A recovery passes when it answers what the uncrashed run
// stored, with the same [workflow.Result] Compensated and Failed, and
// leaves the invariant holding, for which "charge XOR refund" is the usual
// one: paid with one charge and no refund, or not paid with every charge
// refunded once. [Report.Compensated] reports the uncrashed run's outcome.
// [Report.Unreached] lists compensation points only for a run that
// compensated: a run that succeeds passes none by design, and a second
// Case whose world fails explores them.
package crashtest
