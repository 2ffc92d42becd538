package main

// unfenced is the fence (recovery/sql.go) without the owner token: $3 is
// still typed, so the statement runs.
const unfenced = "tenant_id = $1 AND key = $2 AND $3::uuid IS NOT NULL AND status = 'in_flight'"

// mutants are the patches the Guarantees table (docs/guarantees.md) names, one or more
// per row, each with the tests of its row. Keep each patch small and each
// -run narrow: the whole list runs in CI.
var mutants = []Mutant{
	{
		Name:   "claim-not-atomic",
		Breaks: "a takeover's write does not check the rule again, so a claim that read the key absent takes over the concurrent first claim",
		Edits: []Edit{{File: "migrations/sql/0011_not_before.up.sql",
			Old: `    WHERE k.tenant_id = p_tenant AND k.key = p_key
      AND {schema}.onceflow_may_take_over(k, p_workflow, p_hash, p_principal)`,
			New: `    WHERE k.tenant_id = p_tenant AND k.key = p_key`}},
		Pkg: "./recovery", Run: "^TestConcurrentClaimsOneWinner$",
	},
	{
		Name:   "lock-timeout-removed",
		Breaks: "a duplicate's claim waits on the first claim's row lock for its whole first phase",
		Edits: []Edit{{File: "migrations/sql/0010_definitions.up.sql",
			Old: "    PERFORM set_config('lock_timeout', '10ms', true);\n", New: ""}},
		Pkg: "./workflow", Run: "^TestDuplicateDoesNotWaitForTheFirstPhase$",
	},
	{
		Name:   "replay-not-verbatim",
		Breaks: "the stored response body loses its trailing newlines",
		Edits: []Edit{{File: "recovery/sql.go",
			Old: "response_body = $6,", New: `response_body = rtrim($6, '\x0a'::bytea),`}},
		Pkg: "./recovery", Run: "^TestReplayIsByteForByte$",
	},
	{
		Name:   "mismatch-unchecked",
		Breaks: "a finished key replays to a request with another fingerprint",
		Edits: []Edit{{File: "recovery/claim.go",
			Old: "case rec.Fingerprint != p.Fingerprint || rec.Workflow != p.Workflow:",
			New: "case false && (rec.Fingerprint != p.Fingerprint || rec.Workflow != p.Workflow):"}},
		Pkg: "./idemhttp", Run: "^TestMismatch$",
	},
	{
		Name:   "resume-repeats-committed-step",
		Breaks: "a takeover resumes at the recovery point's step instead of after it",
		Edits: []Edit{{File: "workflow/define.go",
			Old: "\t\t\treturn i + 1, true\n", New: "\t\t\treturn i, true\n"}},
		Pkg: "./crashtest", Run: "^TestCheckoutSurvivesEveryCrash$",
	},
	{
		Name:   "advance-unfenced",
		Breaks: "the recovery-point write does not check the owner token",
		Edits: []Edit{{File: "recovery/sql.go",
			Old: "updated_at = clock_timestamp()\nWHERE ` + fence\n\n\t// finishSQL",
			New: "updated_at = clock_timestamp()\nWHERE " + unfenced + "`\n\n\t// finishSQL"}},
		Pkg: "./recovery", Run: "^TestStaleOwnerIsFencedOut$",
	},
	{
		Name:   "renew-unfenced",
		Breaks: "a lease renewal does not check the owner token",
		Edits: []Edit{{File: "recovery/sql.go",
			Old: "WHERE ` + fence + `\nRETURNING locked_until`",
			New: "WHERE " + unfenced + "\nRETURNING locked_until`"}},
		Pkg: "./recovery", Run: "^TestStaleOwnerIsFencedOut$",
	},
	{
		Name:   "finish-unfenced",
		Breaks: "the completion does not check the owner token",
		Edits: []Edit{{File: "recovery/sql.go",
			Old: "completed_at = clock_timestamp(), updated_at = clock_timestamp()\nWHERE ` + fence",
			New: "completed_at = clock_timestamp(), updated_at = clock_timestamp()\nWHERE " + unfenced + "`"}},
		Pkg: "./workflow", Run: "^TestZombieIsFencedOut$",
	},
	{
		Name:   "fence-dropped",
		Breaks: "no write after the claim checks the owner token",
		Edits: []Edit{{File: "recovery/sql.go",
			Old: "const fence = `tenant_id = $1 AND key = $2 AND owner = $3 AND status = 'in_flight'`",
			New: "const fence = `" + unfenced + "`"}},
		// Every key of the storm has a zombie that commits record after
		// its duplicate did (stormZombieAt): caught on every seed.
		Pkg: "./idemhttp", Run: "^TestDuplicateStorm$",
	},
	{
		Name:   "advance-after-commit",
		Breaks: "a phase commits, then its recovery point is written in a transaction of its own",
		Edits: []Edit{{File: "recovery/pipeline.go",
			Old: `	return s.andCommit(ctx, conn, "advance", f, s.sql.advanceOrFail,
		f.Key.Tenant, f.Key.ID, f.Owner, recoveryPoint, state, s.lease)`,
			New: `	if _, err := conn.Exec(ctx, "commit"); err != nil {
		return err
	}
	return s.withConn(conn).Advance(ctx, f, recoveryPoint, state)`}},
		Pkg: "./workflow", Run: "^TestAmbiguousCommit$",
	},
	{
		Name:   "complete-after-commit",
		Breaks: "the last phase commits, then the completion is written in a transaction of its own",
		Edits: []Edit{{File: "recovery/pipeline.go",
			Old: `	return s.andCommit(ctx, conn, "complete", f, s.sql.finishOrFail, args...)`,
			New: `	_ = args
	if _, err := conn.Exec(ctx, "commit"); err != nil {
		return err
	}
	return s.withConn(conn).finish(ctx, "complete", f, StatusCompleted, resp, nil, point, state)`}},
		Pkg: "./workflow", Run: "^TestAmbiguousCommit$",
	},
	{
		Name:   "retry-after-app-clock",
		Breaks: "Retry-After is measured on the application's clock, not the database's",
		Edits: []Edit{{File: "recovery/claim.go",
			Old: "return max(rec.LockedUntil.Sub(dbNow), rec.NotBefore.Sub(dbNow), time.Second)",
			New: "return max(time.Until(rec.LockedUntil), rec.NotBefore.Sub(dbNow), time.Second)"}},
		Pkg: "./workflow", Run: "^TestSkewedClockDoesNotTakeOverAValidLease$",
	},
	{
		Name:   "tenant-dropped",
		Breaks: "the claim reads a key's record whatever its tenant",
		Edits: []Edit{{File: "migrations/sql/0010_definitions.up.sql",
			Old: "WHERE k.tenant_id = p_tenant AND k.key = p_key;",
			New: "WHERE k.key = p_key;"}},
		Pkg: "./recovery", Run: "^TestTenantsAreIsolated$",
	},
	{
		Name:   "input-unchecked",
		Breaks: "names in invalid UTF-8 pass the input rules",
		Edits: []Edit{{File: "recovery/key.go",
			Old: "if r == utf8.RuneError {", New: "if false && r == utf8.RuneError {"}},
		Pkg: "./recovery", Run: "^FuzzClaimInput$",
	},
	{
		Name:   "process-not-deduped",
		Breaks: "Outbox.Process runs the consumer's effect for a message it processed before",
		Edits: []Edit{{File: "outbox/outbox.go",
			Old: "\tif tag.RowsAffected() == 0 {\n\t\treturn false, nil\n\t}\n\treturn true, fn()",
			New: "\t_ = tag\n\treturn true, fn()"}},
		Pkg: "./outbox", Run: "^(TestProcessMakesTheEffectOnce|TestKilledRelayRedelivers)$",
	},
	{
		Name:   "enqueue-duplicate-silent",
		Breaks: "Enqueue of an existing dedupe key says nothing",
		Edits: []Edit{{File: "outbox/outbox.go",
			Old: "if tag.RowsAffected() == 0 {\n\t\t\tdups",
			New: "if tag.RowsAffected() < 0 {\n\t\t\tdups"}},
		Pkg: "./outbox", Run: "^TestEnqueueReportsDuplicates$",
	},
	{
		Name:   "takeover-ignores-lease",
		Breaks: "a takeover does not wait for the lease to end",
		Edits: []Edit{{File: "migrations/sql/0011_not_before.up.sql",
			Old: "k.status = 'in_flight' AND k.locked_until < clock_timestamp() AND k.workflow = p_workflow",
			New: "k.status = 'in_flight' AND k.workflow = p_workflow"}},
		Pkg: "./sweeper", Run: "^TestTwoSweepersCompleteEachRecordOnce$",
	},
	{
		Name:   "permanent-not-terminal",
		Breaks: "a step's permanent error is retried like any other until MaxAttempts, instead of failing the key at once",
		Edits: []Edit{{File: "workflow/attempt.go",
			Old: "\tcase permanent:\n\t\treturn a.failTerminally(", New: "\tcase false && permanent:\n\t\treturn a.failTerminally("}},
		Pkg: "./workflow", Run: "^TestPermanentErrorFailsAtOnce$",
	},
	{
		Name:   "defer-ignored-by-claim",
		Breaks: "the takeover rule ignores a deferred record's not_before, so a retry runs the step again before the other system's Retry-After",
		Edits: []Edit{{File: "migrations/sql/0011_not_before.up.sql",
			Old: "       AND (k.not_before IS NULL OR k.not_before <= clock_timestamp())\n", New: ""}},
		Pkg: "./workflow", Run: "^TestDeferredKeyWaitsUntilNotBefore$",
	},
	{
		Name:   "completer-ignores-deferral",
		Breaks: "the completer counts a deferred record due before its not_before, and spends its batch on takeovers the rule refuses",
		Edits: []Edit{{File: "sweeper/completer.go",
			Old: ",\n                   not_before) AS due_at", New: ") AS due_at"}},
		Pkg: "./sweeper", Run: "^TestCompleterWaitsForADeferral$",
	},
	{
		Name:   "prune-in-flight",
		Breaks: "the pruner goes by completed_at, not by status",
		Edits: []Edit{{File: "sweeper/pruner.go",
			Old: `    WHERE status IN ('completed', 'failed') AND completed_at < statement_timestamp() - $1::bigint * interval '1 microsecond'
    ORDER BY completed_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)) AND status IN ('completed', 'failed')` + "`",
			New: `    WHERE completed_at < statement_timestamp() - $1::bigint * interval '1 microsecond'
    ORDER BY completed_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))` + "`"}},
		Pkg: "./sweeper", Run: "^TestPruningWhileClaiming$",
	},
	{
		Name:   "completer-unfair",
		Breaks: "the completer serves records in due order only, not a turn per tenant",
		Edits: []Edit{{File: "sweeper/completer.go",
			Old: "ORDER BY turn, due_at, tenant_id, key", New: "ORDER BY due_at, tenant_id, key"}},
		Pkg: "./sweeper", Run: "^TestCompleterServesCrashedRecordsAmidPoison$",
	},
	{
		Name:   "extra-commit",
		Breaks: "a foreign step's result commits on its own, not with the next phase",
		Edits: []Edit{{File: "workflow/attempt.go",
			Old: "if a.w.steps[a.next+1].Kind() == phase.KindAtomic {",
			New: "if false && a.w.steps[a.next+1].Kind() == phase.KindAtomic {"}},
		Pkg: "./workflow", Run: "^TestCommitBudget$",
	},
	{
		Name:   "reject-always-deletes",
		Breaks: "a Reject deletes the record even after a foreign step may have run under it",
		Edits: []Edit{{File: "workflow/attempt.go",
			Old: "func (a *attempt[Req, State]) rejectable() bool {\n\treturn ",
			New: "func (a *attempt[Req, State]) rejectable() bool {\n\treturn true || "}},
		Pkg: "./workflow", Run: "^TestRejectAfterTakeoverIsStored$",
	},
	{
		Name:   "deadline-uncounted",
		Breaks: "an attempt that outlived its deadline hands the lease back without counting",
		Edits: []Edit{{File: "workflow/attempt.go",
			Old: "return errors.Is(ctx.Err(), context.Canceled) && !a.acted",
			New: "return ctx.Err() != nil"}},
		Pkg: "./workflow", Run: "^TestDeadlineCountsAsAnAttempt$",
	},
	{
		Name:   "isolation-not-pinned",
		Breaks: "the middleware's transactions take the server's default isolation",
		Edits: []Edit{{File: "idemhttp/middleware.go",
			Old: "var readCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}", New: "var readCommitted = pgx.TxOptions{}"}},
		Pkg: "./idemhttp", Run: "^TestCompletesOnARepeatableReadServer$",
	},
	{
		Name:   "engine-isolation-not-pinned",
		Breaks: "the engine's transactions take the server's default isolation",
		Edits: []Edit{{File: "workflow/attempt.go",
			Old: `const beginSQL = "begin isolation level read committed"`, New: `const beginSQL = "begin"`}},
		Pkg: "./workflow", Run: "^TestPhaseSeesTheRecordAsItIsAtCommit$",
	},
	{
		Name:   "operator-lease-checked-apart",
		Breaks: "keys release and keys fail check the lease before their write, not in it",
		Edits: []Edit{{File: "recovery/sql.go",
			Old: "  AND (status = 'parked' OR (status = 'in_flight' AND locked_until < clock_timestamp()))`",
			New: "  AND status IN ('parked', 'in_flight')`"}},
		Pkg: "./cmd/onceflow", Run: "^TestKeysLeaveALeaseRenewedMeanwhileAlone$",
	},
	{
		Name:   "derived-key-without-record-id",
		Breaks: "the downstream key leaves out the record's id",
		Edits: []Edit{{File: "foreign/key.go",
			Old: "\th.Write(recordID[:])\n", New: "\t_ = recordID\n"}},
		Pkg: "./foreign", Run: "^TestDeriveKey$",
	},
	{
		Name:   "principal-ignored",
		Breaks: "a record made by another principal is answered as the caller's own",
		Edits: []Edit{{File: "recovery/sql.go",
			Old: "<> $10 THEN 4", New: "<> $10 AND false THEN 4"}},
		Pkg: "./idemhttp", Run: "^TestAttackReplayToAnotherPrincipal$",
	},
	{
		Name:   "repeated-tenant-header-taken",
		Breaks: "a trusted tenant header sent twice yields its first copy",
		Edits: []Edit{{File: "idemhttp/key.go",
			Old: "\t\tcase len(values) > 1:\n", New: "\t\tcase len(values) > 1 && false:\n"}},
		Pkg: "./idemhttp", Run: "^TestAttackRepeatedTenantHeaderIsRefused$",
	},
	{
		Name:   "refusals-stored",
		Breaks: "401, 403, 407, 408, 425 and 429 are stored and replayed",
		Edits: []Edit{{File: "idemhttp/config.go",
			Old: "\t\treturn false\n\t}\n\treturn status < 500", New: "\t\treturn true\n\t}\n\treturn status < 500"}},
		Pkg: "./idemhttp", Run: "^TestAttackStoredRefusalIsNotReplayed$",
	},
	{
		Name:   "park-rule-skipped",
		Breaks: "a changed definition resumes a record without comparing the steps up to its recovery point, so a step inserted before it does not park",
		Edits: []Edit{{File: "workflow/versions.go",
			Old: "if !same || got.Kind != st.Kind {",
			New: "if false && (!same || got.Kind != st.Kind) {"}},
		Pkg: "./workflow", Run: "^TestUpgradeParksAStepInsertedBeforeTheRecoveryPoint$",
	},
	{
		Name:   "foreign-after-point-unguarded",
		Breaks: "the foreign step after the recovery point, whose call may have been made, is left out of the comparison, so removing it does not park",
		Edits: []Edit{{File: "workflow/versions.go",
			Old: "\t\ttouched++\n", New: ""}},
		Pkg: "./workflow", Run: "^TestUpgradeRemovedStep$",
	},
	{
		Name:   "renamed-key-from-new-name",
		Breaks: "a step declared Renamed derives its downstream keys from its new name, so a call made under the old one is made again with another key",
		Edits: []Edit{{File: "workflow/attempt.go",
			Old: "a.run.KeyStep = a.w.keyStep(a.next)", New: "a.run.KeyStep = step.Name()"}},
		Pkg: "./workflow", Run: "^TestUpgradeRenamedForeignStepKeepsItsKey$",
	},
	{
		Name:   "versions-not-handed-over",
		Breaks: "a record whose definition is registered with Versions is run by the definition that met it, not handed to its own",
		Edits: []Edit{{File: "workflow/route.go",
			Old: "ok && d.spec().Fingerprint == rec.Definition {", New: "ok && false && d.spec().Fingerprint == rec.Definition {"}},
		Pkg: "./workflow", Run: "^TestVersionsFinishRecordsUnderTheirOwnDefinition$",
	},
	{
		Name:   "restamp-keeps-old-definition",
		Breaks: "a record resumed under a changed definition keeps the old fingerprint, so the next process compares it with the wrong definition",
		Edits: []Edit{{File: "workflow/attempt.go",
			Old: "Restamp(ctx, a.rec.Fence(), sp.Fingerprint, r.point, state)",
			New: "Restamp(ctx, a.rec.Fence(), map[bool]string{true: rec.Definition, false: sp.Fingerprint}[rec.Definition != \"\"], r.point, state)"}},
		Pkg: "./workflow", Run: "^TestRollingDeploy$",
	},
	{
		Name:   "parked-answered-in-flight",
		Breaks: "a retry of a parked record is told the key is in flight (409, retry soon) instead of that it waits for an operator",
		Edits: []Edit{{File: "recovery/claim.go",
			Old: "\t\tcase rec.Status == StatusParked:\n\t\t\treturn nil, 0, &ParkedError{Key: p.Key, Reason: rec.LastError}\n",
			New: ""}},
		Pkg: "./workflow", Run: "^TestUpgradeParksAStepInsertedBeforeTheRecoveryPoint$",
	},
	{
		Name:   "completer-picks-parked",
		Breaks: "the completer resumes parked records, so a process spins on a record it parks again",
		Edits: []Edit{{File: "sweeper/completer.go",
			Old: "WHERE status = 'in_flight' AND locked_until < clock_timestamp() AND workflow = ANY($1)",
			New: "WHERE status IN ('in_flight', 'parked') AND coalesce(locked_until, '-infinity') < clock_timestamp() AND workflow = ANY($1)"}},
		Pkg: "./sweeper", Run: "^TestCompleterLeavesParkedRecordsAndReportsThem$",
	},
	{
		Name:   "pruner-deletes-parked",
		Breaks: "the pruner deletes parked records, which wait for an operator",
		Edits: []Edit{{File: "sweeper/pruner.go",
			Old: "    WHERE status IN ('completed', 'failed') AND completed_at",
			New: "    WHERE status <> 'in_flight' AND completed_at"}, {File: "sweeper/pruner.go",
			Old: ")) AND status IN ('completed', 'failed')`", New: ")) AND status <> 'in_flight'`"}},
		Pkg: "./sweeper", Run: "^TestPrunerKeepsParkedRecords$",
	},
	{
		Name:   "unpark-unfenced",
		Breaks: "an operator's resume --as writes without the owner token it read, so two operators both act",
		Edits: []Edit{{File: "recovery/sql.go",
			Old: "WHERE tenant_id = $1 AND key = $2 AND owner = $3 AND status = 'parked'`",
			New: "WHERE tenant_id = $1 AND key = $2 AND $3::uuid IS NOT NULL AND status = 'parked'`"}},
		Pkg: "./cmd/onceflow", Run: "^TestKeysResumeIsFenced$",
	},
	{
		Name:   "state-shape-unguarded",
		Breaks: "an older release resumes a record whose newer definition changed the state's shape, and misreads the state",
		Edits: []Edit{{File: "workflow/versions.go",
			Old: "old.State != cur.State && old.UpgradesState && !cur.UpgradesState {",
			New: "old.State != cur.State && old.UpgradesState && false {"}},
		Pkg: "./workflow", Run: "^TestUpgradeAttackRollingDeployNewStateShape$",
	},
	{
		Name:   "deploy-check-exits-zero",
		Breaks: "onceflow workflows diff exits 0 when a deploy would park records, so the user's CI passes",
		Edits: []Edit{{File: "cmd/onceflow/main.go",
			Old: "\t\treturn wouldParkExitCode\n", New: "\t\treturn 0\n"}},
		Pkg: "./examples/checkout", Run: "^TestDeployCheck$",
	},
}
