package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

func newKeysResume(opts *options) *cobra.Command {
	var as string
	cmd := &cobra.Command{
		Use:   "resume TENANT KEY",
		Short: "Resume a parked key under a version of its workflow that you choose",
		Long: `resume puts a parked key back in flight, to run under the version of its workflow
that --as names (its version label, or its full fingerprint, as keys show and
workflows export list them), from its recovery point. The next claim of the key, or
the completer, takes it over and runs the steps after the recovery point as that
version defines them, reading the state through that version's UpgradeState when
another version wrote it.

It is your word that the version can continue what the key's own definition
started: the rules for a changed definition are not checked. The key's recovery
point must be a step of that version. The version must be registered in the
processes that run the workflow: one that does not register it parks the key
again. The change is fenced by the owner token read: of two operators, one wins.`,
		Example: `  onceflow keys resume acme order-42 --as 2`,
		Args:    args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, a []string) error {
			if as == "" {
				return usageError{errors.New("--as must name a version")}
			}
			return opts.resume(cmd, recovery.Key{Tenant: a[0], ID: a[1]}, as)
		},
	}
	cmd.Flags().StringVar(&as, "as", "", "the `VERSION` (or full fingerprint) of the key's workflow to run it under")
	_ = cmd.MarkFlagRequired("as") // it exists
	return cmd
}

// resume unparks key to run under the stored definition of its workflow
// that version names.
func (o *options) resume(cmd *cobra.Command, key recovery.Key, version string) error {
	ctx := cmd.Context()
	store, db, err := o.store(cmd)
	if err != nil {
		return err
	}
	defer db.Close()
	rec, err := store.Load(ctx, key)
	if err != nil {
		return err
	}
	if rec.Status != recovery.StatusParked {
		return fmt.Errorf("key %q of tenant %q is %s, not parked: only a parked key is resumed under a version of your choice",
			key.ID, key.Tenant, rec.Status)
	}
	def, spec, err := storedVersion(ctx, store, rec.Workflow, version)
	if err != nil {
		return err
	}
	if rec.RecoveryPoint != "" && !slices.ContainsFunc(spec.Steps, func(s workflow.StepInfo) bool { return s.Name == rec.RecoveryPoint }) {
		return fmt.Errorf("key %q of tenant %q: its recovery point %q is not a step of version %s of %s (steps: %s)",
			key.ID, key.Tenant, rec.RecoveryPoint, def.Version, rec.Workflow, stepList(spec.Steps))
	}
	if err := store.Unpark(ctx, rec.Fence(), def.Fingerprint, "resumed by an operator as version "+def.Version); err != nil {
		if errors.Is(err, recovery.ErrLeaseLost) {
			return fmt.Errorf("the key changed while this command ran; look again: %w", err)
		}
		return err
	}
	after := "before its first step"
	if rec.RecoveryPoint != "" {
		after = "after its recovery point " + printable(rec.RecoveryPoint)
	}
	fmt.Fprintf(o.stdout, "resumed key %q of tenant %q as version %s of %s (fingerprint %s), %s\n",
		key.ID, key.Tenant, printable(def.Version), printable(rec.Workflow), def.Fingerprint, after)
	fmt.Fprintf(o.stdout, "the next claim of the key, or the completer, runs it under version %s: the processes that run %s must register it, or they park the key again\n",
		printable(def.Version), printable(rec.Workflow))
	return nil
}

// storedVersion returns the stored definition of workflow whose version
// label or fingerprint is version, and its spec.
func storedVersion(ctx context.Context, store *recovery.Store, wf, version string) (recovery.StoredDefinition, workflow.Spec, error) {
	defs, err := store.Definitions(ctx, wf, "")
	if err != nil {
		return recovery.StoredDefinition{}, workflow.Spec{}, err
	}
	var matches []recovery.StoredDefinition
	for _, d := range defs {
		if d.Fingerprint == version {
			matches = []recovery.StoredDefinition{d}
			break
		}
		if d.Version == version {
			matches = append(matches, d)
		}
	}
	matches = dropSuperseded(matches)
	switch len(matches) {
	case 0:
		known := make([]string, len(defs))
		for i, d := range defs {
			known[i] = d.Version
		}
		return recovery.StoredDefinition{}, workflow.Spec{}, fmt.Errorf(
			"workflow %s has no stored version %q (stored: %s); a version is stored when a process registers it (builds its engine with it, or first runs it)",
			wf, version, cmp.Or(strings.Join(known, ", "), "none"))
	case 1:
	default:
		fps := make([]string, len(matches))
		for i, d := range matches {
			fps[i] = d.Fingerprint
		}
		return recovery.StoredDefinition{}, workflow.Spec{}, fmt.Errorf(
			"version %q of workflow %s names %d definitions (fingerprints %s): pass --as the fingerprint of the one you mean",
			version, wf, len(matches), strings.Join(fps, ", "))
	}
	var spec workflow.Spec
	if err := json.Unmarshal(matches[0].Spec, &spec); err != nil {
		return recovery.StoredDefinition{}, workflow.Spec{}, fmt.Errorf("decode stored definition %s of %s: %w", matches[0].Fingerprint, wf, err)
	}
	return matches[0], spec, nil
}

// dropSuperseded drops from defs each definition another one of them
// supersedes: one stored by a build from before definitions recorded what
// they undo, under the fingerprint that build gave a definition this
// build stores again under its own (Spec.Earlier), with the same version
// label. Engines take a record of either for the newer one.
func dropSuperseded(defs []recovery.StoredDefinition) []recovery.StoredDefinition {
	if len(defs) < 2 {
		return defs
	}
	legacy := map[string]bool{}
	for _, d := range defs {
		var spec workflow.Spec
		if json.Unmarshal(d.Spec, &spec) == nil && spec.Earlier != nil {
			legacy[spec.Earlier.Fingerprint] = true
		}
	}
	return slices.DeleteFunc(defs, func(d recovery.StoredDefinition) bool { return legacy[d.Fingerprint] })
}

func stepList(steps []workflow.StepInfo) string {
	names := make([]string, len(steps))
	for i, s := range steps {
		names[i] = s.Name
	}
	return strings.Join(names, ", ")
}
