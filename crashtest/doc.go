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
// FreshDatabase (or Databases, outside a test) gives each world a database
// of its own, migrated with package migrations and dropped at the end, on a
// server whose user may CREATE DATABASE.
package crashtest
