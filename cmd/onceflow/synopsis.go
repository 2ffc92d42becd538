package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// newDocs is the hidden command that prints the documentation generated
// from the command tree, so that the docs cannot drift from it.
func newDocs(root *cobra.Command, opts *options) *cobra.Command {
	docs := group(&cobra.Command{
		Use:    "docs",
		Short:  "Print documentation generated from the command tree",
		Hidden: true,
	})
	docs.AddCommand(&cobra.Command{
		Use:   "synopsis",
		Short: "Print the synopsis of every command, as the docs show it between <!-- synopsis --> markers",
		Args:  args(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprint(opts.stdout, synopsis(root))
			return err
		},
	})
	return docs
}

// synopsis is one line per command that runs (groups are left out, and
// hidden commands), with its arguments and its own flags, then a line of
// the flags every command takes.
func synopsis(root *cobra.Command) string {
	var b strings.Builder
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		if c.HasSubCommands() {
			for _, sub := range c.Commands() {
				walk(sub)
			}
			return
		}
		line := []string{c.CommandPath()}
		if _, positional, found := strings.Cut(c.Use, " "); found {
			line = append(line, positional)
		}
		c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) { line = append(line, flagSynopsis(f)) })
		fmt.Fprintln(&b, strings.Join(line, " "))
	}
	walk(root)
	var global []string
	root.PersistentFlags().VisitAll(func(f *pflag.Flag) { global = append(global, flagSynopsis(f)) })
	fmt.Fprintf(&b, "every command: %s [--help]\n", strings.Join(global, " "))
	return b.String()
}

// flagSynopsis is "[--name value]", "[--name]" for a switch, with the
// short form first when there is one; a required flag has no brackets.
func flagSynopsis(f *pflag.Flag) string {
	name := "--" + f.Name
	if f.Shorthand != "" {
		name = "-" + f.Shorthand + "|" + name
	}
	if value, _ := pflag.UnquoteUsage(f); value != "" && f.NoOptDefVal == "" {
		name += " " + value
	}
	if slices.Contains(f.Annotations[cobra.BashCompOneRequiredFlag], "true") {
		return name
	}
	return "[" + name + "]"
}
