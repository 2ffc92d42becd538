package main

import (
	"encoding/json"
	"io"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/workflow"
)

// definitions lists every workflow definition the service registers: what
// serve runs, and what workflows export writes for the deploy check. When
// a change to the checkout would park records in flight, keep the old
// definition here too: workflow.Versions(checkoutV1, checkout).
func definitions(checkout *workflow.Workflow[CheckoutRequest, CheckoutState]) []workflow.Definition {
	return []workflow.Definition{checkout}
}

func newWorkflowsCmd() *cobra.Command {
	group := &cobra.Command{
		Use:   "workflows",
		Short: "The service's workflow definitions",
		Args:  cobra.NoArgs,
	}
	group.AddCommand(&cobra.Command{
		Use:   "export",
		Short: "Write the workflow definitions this build registers, as JSON",
		Long: `export writes the workflow definitions this build of the service registers
(Engine.Specs), as a JSON array: the current side of onceflow's deploy check,

  onceflow workflows diff <(onceflow workflows export) <(checkout workflows export)

which exits 3 when records that production's definitions left in flight would be
parked by this build's. It needs no database.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return exportWorkflows(cmd.OutOrStdout())
		},
	})
	return group
}

// exportWorkflows writes the specs of the definitions serve registers.
func exportWorkflows(w io.Writer) error {
	a := &app{}
	engine, err := workflow.NewEngine(nil, workflow.Config{Workflows: definitions(a.checkout())})
	if err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(engine.Specs())
}
