package crashtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/workflow"
)

// UpgradeReport is what ExploreUpgrade found in each direction of a
// deploy.
type UpgradeReport struct {
	// Forward stops the deployed definition (World.Workflow) at each of its
	// crash points and recovers under the next one (World.Next), in a new
	// process that registers it alone: a deploy.
	Forward *Report
	// Reverse stops the next definition at each of its crash points and
	// recovers under the deployed one: a process of the old release taking
	// over a record the new one wrote, while both run during a rolling
	// deploy, or after a rollback.
	Reverse *Report
}

// Err joins every failed experiment's error; nil when all passed.
func (r *UpgradeReport) Err() error {
	var errs []error
	if err := r.Forward.Err(); err != nil {
		errs = append(errs, fmt.Errorf("%s stopped, %s recovering: %w", r.Forward.Definition.Version, r.Reverse.Definition.Version, err))
	}
	if err := r.Reverse.Err(); err != nil {
		errs = append(errs, fmt.Errorf("%s stopped, %s recovering: %w", r.Reverse.Definition.Version, r.Forward.Definition.Version, err))
	}
	return errors.Join(errs...)
}

// Upgrade explores an upgrade of c's workflow from World.Workflow to
// World.Next (see ExploreUpgrade), fails t for every experiment that
// fails, and logs at which crash points each direction resumed and parked.
func Upgrade[Req, State any](t testing.TB, c Case[Req, State]) *UpgradeReport {
	t.Helper()
	report, err := ExploreUpgrade(context.Background(), c)
	if err != nil {
		t.Fatalf("crashtest: %v", err)
	}
	for _, dir := range []struct{ stopped, recovering *Report }{
		{report.Forward, report.Reverse}, {report.Reverse, report.Forward},
	} {
		from, to := dir.stopped.Definition.Version, dir.recovering.Definition.Version
		dir.stopped.failTest(t, fmt.Sprintf("%s stopped, %s recovering: ", from, to))
		t.Logf("crashtest: %s stopped at each of %d crash points, %s recovering: resumed after %d, parked after %d%s",
			from, len(dir.stopped.Points), to, len(dir.stopped.Resumed()), len(dir.stopped.Parked()), listPoints(dir.stopped.Parked()))
	}
	return report
}

// ExploreUpgrade runs the experiments of Explore across two definitions
// of one workflow, World.Workflow (deployed) and World.Next (the next
// release's), which take the same request: each definition is stopped at
// each of its crash points, and the other recovers, from a new process
// that registers it alone. A recovery passes when it finishes the work
// with the response of an uncrashed run of the definition that finished
// it (the recovering one, or the stopped one when its attempt had
// completed the record), or when it parks the record (workflow.ErrParked)
// and an operator's resume as the definition that wrote it
// (Engine.ResumeAs) then finishes it with that definition's response. The
// world's invariant must hold after each, whichever definition finished
// the work: a step that only one definition has may not have run.
// Report.Parked and Report.Resumed say where each direction parked and
// resumed.
//
// Its error is for a case that cannot be explored at all: an uncrashed run
// of either definition fails, the world has no Next definition, or both
// are one definition.
func ExploreUpgrade[Req, State any](ctx context.Context, c Case[Req, State]) (*UpgradeReport, error) {
	c = c.withDefaults()
	deployed, err := c.baseline(ctx, (*World[Req, State]).current)
	if err != nil {
		return nil, fmt.Errorf("deployed definition: %w", err)
	}
	next, err := c.baseline(ctx, (*World[Req, State]).next)
	if err != nil {
		return nil, fmt.Errorf("next definition: %w", err)
	}
	if deployed.Definition.Fingerprint == next.Definition.Fingerprint {
		return nil, fmt.Errorf("World.Workflow and World.Next are one definition (version %s)", next.Definition.Version)
	}
	c.crashEach(ctx, deployed, deployment[Req, State]{
		crashed: (*World[Req, State]).current, recovering: (*World[Req, State]).next,
		crashedRun: deployed.answer(), recoveringRun: next.answer(), mayPark: true,
	})
	c.crashEach(ctx, next, deployment[Req, State]{
		crashed: (*World[Req, State]).next, recovering: (*World[Req, State]).current,
		crashedRun: next.answer(), recoveringRun: deployed.answer(), mayPark: true,
	})
	return &UpgradeReport{Forward: deployed, Reverse: next}, nil
}

// listPoints formats points after a colon, or nothing for none.
func listPoints(points []workflow.CrashPoint) string {
	if len(points) == 0 {
		return ""
	}
	names := make([]string, len(points))
	for i, p := range points {
		names[i] = p.String()
	}
	return ": " + strings.Join(names, ", ")
}
