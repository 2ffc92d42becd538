package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/migrations"
)

func newMigrate(opts *options) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "migrate",
		Short: "Apply, revert or list schema migrations",
		Long: `Migrations are numbered SQL files built into this binary. Each runs in its own
transaction under an advisory lock, so several processes may migrate at once.`,
	})
	var (
		upTo, downTo int
		asJSON       bool
	)
	up := &cobra.Command{
		Use:   "up",
		Short: "Apply every migration not yet applied (or up to --to)",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			target := migrations.Latest()
			if cmd.Flags().Changed("to") {
				target = upTo
			}
			return opts.migrate(cmd, func(m *migrations.Migrator) ([]migrations.Migration, error) {
				return m.To(cmd.Context(), target)
			}, "applied", asJSON)
		},
	}
	up.Flags().IntVar(&upTo, "to", 0, "migrate up to this version")
	up.Flags().BoolVar(&asJSON, "json", false, `print JSON: {"applied": [{"version": 1, "name": "keys"}, ...]}`)
	down := &cobra.Command{
		Use:   "down",
		Short: "Revert the last migration (or down to --to; 0 reverts everything)",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return opts.migrate(cmd, func(m *migrations.Migrator) ([]migrations.Migration, error) {
				if cmd.Flags().Changed("to") {
					return m.To(cmd.Context(), downTo)
				}
				return m.Down(cmd.Context())
			}, "reverted", asJSON)
		},
	}
	down.Flags().IntVar(&downTo, "to", 0, "migrate down to this version")
	down.Flags().BoolVar(&asJSON, "json", false, `print JSON: {"reverted": [{"version": 8, "name": "claim_principal"}, ...]}`)
	status := &cobra.Command{
		Use:   "status",
		Short: "List migrations and whether each is applied",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			db, err := opts.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			m, err := migrations.New(db, migrations.Config{Schema: opts.schema})
			if err != nil {
				return err
			}
			list, err := m.Status(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				type row struct {
					Version   int        `json:"version"`
					Name      string     `json:"name"`
					Applied   bool       `json:"applied"`
					AppliedAt *time.Time `json:"applied_at,omitempty"`
				}
				rows := make([]row, len(list))
				for i, s := range list {
					rows[i] = row{Version: s.Version, Name: s.Name, Applied: s.Applied}
					if s.Applied {
						rows[i].AppliedAt = &s.AppliedAt
					}
				}
				return writeJSON(opts.stdout, rows)
			}
			t := newTable(opts.stdout, "VERSION", "NAME", "APPLIED")
			for _, s := range list {
				applied := "no"
				if s.Applied {
					applied = s.AppliedAt.Format(time.RFC3339)
				}
				t.row(fmt.Sprintf("%04d", s.Version), s.Name, applied)
			}
			return t.flush()
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(up, down, status)
	return cmd
}

// migrate runs do with a migrator and prints what it applied or reverted,
// as text or, asJSON, as {verb: [{"version", "name"}, ...]}: also when a
// migration failed part-way, so that what was done is told.
func (o *options) migrate(cmd *cobra.Command, do func(*migrations.Migrator) ([]migrations.Migration, error), verb string, asJSON bool) error {
	db, err := o.connect(cmd.Context())
	if err != nil {
		return err
	}
	defer db.Close()
	m, err := migrations.New(db, migrations.Config{Schema: o.schema, Logger: o.logger()})
	if err != nil {
		return err
	}
	done, err := do(m)
	if asJSON {
		type migration struct {
			Version int    `json:"version"`
			Name    string `json:"name"`
		}
		list := make([]migration, len(done))
		for i, mig := range done {
			list[i] = migration{mig.Version, mig.Name}
		}
		if werr := writeJSON(o.stdout, map[string][]migration{verb: list}); werr != nil {
			return werr
		}
		return err
	}
	for _, mig := range done {
		fmt.Fprintf(o.stdout, "%s %04d_%s\n", verb, mig.Version, mig.Name)
	}
	if err != nil {
		return err
	}
	if len(done) == 0 {
		fmt.Fprintln(o.stdout, "nothing to do")
	}
	return nil
}
