package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/outbox"
)

func newOutbox(opts *options) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "outbox",
		Short: "Inspect outbox messages and retry dead ones",
	})
	cmd.AddCommand(
		newOutboxList(opts, "list", "List outbox messages, oldest first", ""),
		newOutboxList(opts, "dead", "List dead-lettered messages", outbox.StatusDead),
		newOutboxRetry(opts),
	)
	return cmd
}

func newOutboxList(opts *options, use, short string, fixed outbox.Status) *cobra.Command {
	var (
		f      outbox.Filter
		status string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := limit(f.Limit); err != nil {
				return err
			}
			f.Status = fixed
			if fixed == "" {
				switch outbox.Status(status) {
				case "", outbox.StatusPending, outbox.StatusDelivered, outbox.StatusDead:
					f.Status = outbox.Status(status)
				default:
					return usageError{fmt.Errorf("--status must be pending, delivered or dead, not %q", status)}
				}
			}
			ob, db, err := opts.outbox(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			msgs, err := ob.List(cmd.Context(), db, f)
			if err != nil {
				return err
			}
			if asJSON {
				if msgs == nil {
					msgs = []outbox.Record{}
				}
				return writeJSON(opts.stdout, msgs)
			}
			t := newTable(opts.stdout, "ID", "TOPIC", "DEDUPE KEY", "STATUS", "ATTEMPTS", "AVAILABLE", "LAST ERROR")
			for _, m := range msgs {
				t.row(strconv.FormatInt(m.ID, 10), m.Topic, m.DedupeKey, string(m.Status), strconv.Itoa(m.Attempts),
					m.AvailableAt.Format(time.RFC3339), shorten(m.LastError, 60))
			}
			return t.flush()
		},
	}
	if fixed == "" {
		cmd.Flags().StringVar(&status, "status", "", "only messages in this status: pending, delivered or dead")
	}
	cmd.Flags().StringVar(&f.Topic, "topic", "", "only messages of this topic")
	cmd.Flags().IntVar(&f.Limit, "limit", 100, "list at most this many")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newOutboxRetry(opts *options) *cobra.Command {
	return &cobra.Command{
		Use:   "retry ID...",
		Short: "Make dead or pending messages deliverable now, with a fresh count of attempts",
		Args:  args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			ids := make([]int64, len(a))
			for i, s := range a {
				id, err := strconv.ParseInt(s, 10, 64)
				if err != nil {
					return usageError{fmt.Errorf("message id %q is not a number", s)}
				}
				ids[i] = id
			}
			ob, db, err := opts.outbox(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			for _, id := range ids {
				if err := ob.Retry(cmd.Context(), db, id); err != nil {
					return err
				}
				fmt.Fprintf(opts.stdout, "message %d will be delivered now, with a fresh count of attempts\n", id)
			}
			return nil
		},
	}
}

func (o *options) outbox(cmd *cobra.Command) (*outbox.Outbox, interface {
	outbox.DBTX
	Close()
}, error) {
	ob, err := outbox.New(outbox.Config{Schema: o.schema})
	if err != nil {
		return nil, nil, err
	}
	db, err := o.connect(cmd.Context())
	if err != nil {
		return nil, nil, err
	}
	return ob, db, nil
}
