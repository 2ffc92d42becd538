// Package admin is the operator's surface over onceflow's key records and
// outbox: a Go API to list, inspect and unstick work, and an HTTP JSON API
// (and the web console) served by [Admin.Handler].
//
// # Reading
//
// [Admin.List] finds records by tenant, workflow, status, how long they
// have been stuck and when they were created, a page at a time (keyset
// pagination: [Page.Next] continues where a page ended). [Admin.Show]
// returns one record in full: its request, state, recovery point, attempts,
// last error, response and compensations still to run.
//
// # Acting
//
// Each action ([Admin.Release], [Admin.Fail], [Admin.ResumeNow]) is fenced
// by the owner token the operator read ([Record.Owner]): if the record
// changed hands since, nothing is written and the action returns
// [ErrChanged]. A record whose lease is still valid may have a holder at
// work: the action refuses it with a [*LiveLeaseError] unless forced.
// [Admin.RetryDead] makes a dead outbox message deliverable again.
// [Admin.Bulk] and [Admin.BulkRetryDead] apply an action to every record
// (message) a filter matches, at most [Config.MaxBulk], each one fenced on
// its own, and report what they did.
//
// # Access
//
// The handler asks [Config.Authorize], which the application supplies, for
// each request's [Role]: [RoleRead] may read, [RoleWrite] may also act.
// There is no default that lets anyone in: [New] refuses a Config without
// Authorize. State-changing requests must be JSON and pass
// [net/http.CrossOriginProtection], so that a page on another origin
// cannot make an operator's browser act.
package admin
