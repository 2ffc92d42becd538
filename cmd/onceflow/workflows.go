package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/workflow"
)

// wouldParkExitCode is the exit code of workflows diff when records would
// park: distinct from a failure (1) and a wrong call (2), so that CI can
// tell an unsafe deploy from a check that could not run.
const wouldParkExitCode = 3

// maxDefinitionsFile bounds what workflows diff reads of each file.
const maxDefinitionsFile = 64 << 20

// errWouldPark is what workflows diff returns when records would park.
var errWouldPark = errors.New("records would park")

func newWorkflows(opts *options) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "workflows",
		Short: "Export workflow definitions, and check a deploy against them",
	})
	cmd.AddCommand(newWorkflowsExport(opts), newWorkflowsDiff(opts))
	return cmd
}

func newWorkflowsExport(opts *options) *cobra.Command {
	var (
		name string
		all  bool
	)
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Write the workflow definitions records in flight still need, as JSON",
		Long: `export writes the workflow definitions that records in flight or parked were written
by (or are to be resumed as), oldest first, as a JSON array: the previous release's
side of workflows diff. A definition with nothing left in flight is left out, so that
a version dropped after its records finished fails no later deploy. With --all, it
writes every definition the database stores (a process stores its definitions when
it registers them: when its engine is built, or a workflow first runs).`,
		Example: `  onceflow workflows export > prev.json
  onceflow workflows diff <(onceflow workflows export) <(yourservice workflows export)`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			store, db, err := opts.store(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			defs, err := store.DefinitionsInUse(cmd.Context(), name)
			if all {
				defs, err = store.Definitions(cmd.Context(), name, "")
			}
			if err != nil {
				return err
			}
			specs := make([]workflow.Spec, len(defs))
			for i, d := range defs {
				if err := json.Unmarshal(d.Spec, &specs[i]); err != nil {
					return fmt.Errorf("decode stored definition %s of %s: %w", d.Fingerprint, d.Workflow, err)
				}
			}
			return writeJSON(opts.stdout, specs)
		},
	}
	cmd.Flags().StringVar(&name, "workflow", "", "only this workflow's definitions")
	cmd.Flags().BoolVar(&all, "all", false, "every stored definition, also those no record in flight needs")
	return cmd
}

func newWorkflowsDiff(opts *options) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "diff PREV.json CUR.json",
		Short: "Say which in-flight records of the previous definitions the current ones would park",
		Long: `diff reads the definitions of the previous release (PREV.json, as workflows export
writes them from its database) and of the release about to be deployed (CUR.json,
from the new build: Engine.Specs as JSON), and lists every recovery point at which a
record the previous definitions left in flight would be parked by the current ones.

It exits 0 when nothing would park, and 3 when something would: run it in CI so that
an unsafe deploy fails there. It exits 1 when it cannot read the files.

A record would park where the current definition may not continue what it did: a step
changed, inserted or removed up to its recovery point (or a foreign step after it whose
call may have been made), or what a terminal failure would undo of those steps changed
(the point of no return moved past the record or before it, a compensation added or
dropped). Definitions exported by a build from before onceflow recorded what they
undo are compared by their steps alone, with a note on stderr.`,
		Example: `  onceflow workflows diff <(onceflow workflows export) <(checkout workflows export)`,
		Args:    args(cobra.ExactArgs(2)),
		RunE: func(_ *cobra.Command, a []string) error {
			prev, err := readSpecs(a[0])
			if err != nil {
				return err
			}
			cur, err := readSpecs(a[1])
			if err != nil {
				return err
			}
			for i, specs := range [][]workflow.Spec{prev, cur} {
				if slices.ContainsFunc(specs, func(s workflow.Spec) bool { return s.Compensation == nil }) {
					fmt.Fprintf(opts.stderr, "note: %s holds definitions from a build that did not record what they undo (compensations, the point of no return): a change of that is not checked for them\n", a[i])
				}
			}
			findings := workflow.Diff(prev, cur)
			if findings == nil {
				findings = []workflow.Finding{}
			}
			if asJSON {
				if err := writeJSON(opts.stdout, findings); err != nil {
					return err
				}
			} else {
				for _, f := range findings {
					fmt.Fprintln(opts.stdout, printable(f.String()))
				}
			}
			if len(findings) > 0 {
				points := "recovery points"
				if len(findings) == 1 {
					points = "recovery point"
				}
				return fmt.Errorf("%w at %d %s: in-flight records there would wait for an operator after this deploy", errWouldPark, len(findings), points)
			}
			if !asJSON {
				fmt.Fprintln(opts.stdout, "nothing would park: every in-flight record of the previous definitions resumes under the current ones")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the findings as JSON")
	return cmd
}

// readSpecs reads a JSON array of definitions from the file at path (which
// may be a pipe, as <(...) makes), and checks that each names a workflow
// and its steps.
func readSpecs(path string) ([]workflow.Spec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	body, err := io.ReadAll(io.LimitReader(f, maxDefinitionsFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(body) > maxDefinitionsFile {
		return nil, fmt.Errorf("%s is larger than %d bytes: not a definitions export", path, maxDefinitionsFile)
	}
	var specs []workflow.Spec
	if err := json.Unmarshal(body, &specs); err != nil {
		return nil, fmt.Errorf("%s is not a JSON array of workflow definitions (workflows export): %w", path, err)
	}
	for i, s := range specs {
		if s.Workflow == "" || s.Fingerprint == "" || s.Version == "" || len(s.Steps) == 0 {
			return nil, fmt.Errorf("%s: definition %d has no workflow, fingerprint, version or steps: not a workflows export", path, i+1)
		}
		for _, st := range s.Steps {
			if st.Name == "" || st.Kind != phase.KindAtomic && st.Kind != phase.KindForeign {
				return nil, fmt.Errorf("%s: definition %d (%s %s) has a step without a name or kind", path, i+1, s.Workflow, s.Version)
			}
		}
	}
	return specs, nil
}
