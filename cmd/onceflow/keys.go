package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/admin"
	"github.com/onceflow/onceflow/internal/seam"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

func newKeys(opts *options) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "keys",
		Short: "Inspect and unstick idempotency keys",
	})
	cmd.AddCommand(newKeysList(opts), newKeysShow(opts), newKeysRelease(opts), newKeysFail(opts), newKeysResume(opts))
	return cmd
}

func newKeysList(opts *options) *cobra.Command {
	var (
		f      recovery.ListFilter
		status string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List keys, least recently updated first",
		Example: `  onceflow keys list --status in_flight --stuck-for 10m
  onceflow keys list --status parked
  onceflow keys list --tenant acme --json`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := limit(f.Limit); err != nil {
				return err
			}
			switch recovery.Status(status) {
			case "", recovery.StatusInFlight, recovery.StatusCompleted, recovery.StatusFailed, recovery.StatusParked, recovery.StatusCompensated:
				f.Status = recovery.Status(status)
			default:
				return usageError{fmt.Errorf("--status must be in_flight, parked, completed, failed or compensated, not %q", status)}
			}
			store, db, err := opts.store(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			recs, err := store.List(cmd.Context(), f)
			if err != nil {
				return err
			}
			if asJSON {
				defs, err := store.Definitions(cmd.Context(), "", "")
				if err != nil {
					return err
				}
				out := make([]*admin.Detail, len(recs))
				for i, r := range recs {
					out[i] = admin.Describe(r, defs)
				}
				return writeJSON(opts.stdout, out)
			}
			t := newTable(opts.stdout, "TENANT", "KEY", "WORKFLOW", "STATUS", "POINT", "ATTEMPTS", "UPDATED", "LAST ERROR")
			for _, r := range recs {
				t.row(r.Key.Tenant, r.Key.ID, r.Workflow, string(r.Status), r.RecoveryPoint, strconv.Itoa(r.Attempts),
					r.UpdatedAt.Format(time.RFC3339), shorten(r.LastError, 60))
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&f.Tenant, "tenant", "", "only this tenant's keys")
	cmd.Flags().StringVar(&status, "status", "", "only keys in this status: in_flight, parked, completed, failed or compensated")
	cmd.Flags().DurationVar(&f.StuckFor, "stuck-for", 0, "only keys in flight with no progress for longer than this")
	cmd.Flags().IntVar(&f.Limit, "limit", 100, "list at most this many")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newKeysShow(opts *options) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show TENANT KEY",
		Short: "Show one key's record, with its request, state and response",
		Long: `show prints a key's record: its status, recovery point, the version of the
workflow definition that wrote it, its request, state and response. A parked
key shows why it was parked, and the version an operator chose to resume it
under (keys resume), if any. A deferred key (a step asked to come back
later) shows the time before which nothing resumes it; keys release ends
the deferral.

Below the record, show prints its history: the latest transitions (claimed,
taken over, phase committed, released, deferred, renewed late, parked,
compensating, undone, completed, failed, an operator's release, fail or
resume), oldest first, each with its time by the database clock, the owner
token of the attempt that made it, and the step and error it concerns.`,
		Args: args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, a []string) error {
			store, db, err := opts.store(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			rec, err := store.Load(cmd.Context(), recovery.Key{Tenant: a[0], ID: a[1]})
			if err != nil {
				return err
			}
			defs, err := store.Definitions(cmd.Context(), rec.Workflow, "")
			if err != nil {
				return err
			}
			out := admin.Describe(rec, defs)
			if asJSON {
				return writeJSON(opts.stdout, out)
			}
			t := newTable(opts.stdout, "FIELD", "VALUE")
			t.row("tenant", out.Tenant)
			t.row("key", out.Key)
			t.row("id", out.ID)
			t.row("workflow", out.Workflow)
			t.row("status", string(out.Status))
			t.row("recovery point", out.RecoveryPoint)
			t.row("definition", out.Definition.String())
			if out.ResumeAs != nil {
				t.row("resume as", out.ResumeAs.String())
			}
			t.row("attempts", strconv.Itoa(out.Attempts))
			t.row("lease", lease(rec))
			if out.NotBefore != nil {
				t.row("not before", out.NotBefore.Format(time.RFC3339Nano)+" (deferred by its last attempt)")
			}
			switch {
			case rec.Compensating():
				t.row("compensating", "still to undo: "+strings.Join(out.Undo, ", "))
			case len(out.Undo) > 0:
				t.row("not undone", strings.Join(out.Undo, ", ")+" (a compensation failed for good; undo these by hand)")
			}
			if rec.Status == recovery.StatusParked {
				t.row("parked because", out.LastError)
			} else {
				t.row("last error", out.LastError)
			}
			t.row("created", out.CreatedAt.Format(time.RFC3339Nano))
			t.row("updated", out.UpdatedAt.Format(time.RFC3339Nano))
			t.row("request", string(out.Request))
			t.row("state", string(out.State))
			if out.Response != nil {
				body := out.Response.BodyBase64
				if body == "" {
					body = string(rec.Response.Body)
				}
				t.row("response", fmt.Sprintf("%d %s", out.Response.Status, body))
			}
			if rec.TraceParent != "" {
				t.row("trace parent", rec.TraceParent)
			}
			if err := t.flush(); err != nil {
				return err
			}
			return writeHistory(opts.stdout, rec)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newKeysRelease(opts *options) *cobra.Command {
	var (
		reason string
		force  bool
	)
	cmd := &cobra.Command{
		Use:   "release TENANT KEY",
		Short: "Hand a key's lease back so that a retry or the sweeper resumes it at once",
		Long: `release ends the lease of a key in flight, as if its holder had failed: the record
stays at its recovery point, its attempts grow by one, and the next claim takes it
over at once. Whoever held the lease is fenced out: its next write fails. A
deferred key (keys show prints its "not before") is released from its deferral
too.

A key whose lease is still valid may have a holder at work: release refuses it
unless --force is given.

A parked key goes back in flight the same way: the next claim or the completer
takes it over and applies the rules for a changed definition again (it parks
again unless a version the running processes register may resume it, after a
deploy with workflow.Versions, say). To choose the version yourself, use keys
resume.`,
		Args: args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, a []string) error {
			return opts.onInFlight(cmd, recovery.Key{Tenant: a[0], ID: a[1]}, force, func(store *recovery.Store, rec *recovery.Record) error {
				cause := "released by an operator: " + reason
				if force && rec.Status == recovery.StatusInFlight {
					return seam.StoreOf(store).ForceRelease(cmd.Context(), rec.Fence(), cause)
				}
				return seam.StoreOf(store).ReleaseLeaseOver(cmd.Context(), rec.Fence(), cause)
			}, "released")
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "no reason given", "why, kept as the key's last error")
	cmd.Flags().BoolVar(&force, "force", false, "release the key even though its lease is still valid")
	return cmd
}

func newKeysFail(opts *options) *cobra.Command {
	var (
		reason string
		force  bool
	)
	cmd := &cobra.Command{
		Use:   "fail TENANT KEY",
		Short: "Fail a key terminally: retries get a stored 500 and nothing runs again",
		Long: `fail ends a key in flight, or parked, for good: its retries get a stored 500 and
nothing runs again. Whoever held the lease is fenced out: its next write fails. Steps
that already committed stay committed: fail undoes nothing (an order created, a
charge made), so settle their effects yourself if they must not stand.

A key whose lease is still valid may have a holder at work: fail refuses it
unless --force is given.`,
		Args: args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, a []string) error {
			var committed string
			err := opts.onInFlight(cmd, recovery.Key{Tenant: a[0], ID: a[1]}, force, func(store *recovery.Store, rec *recovery.Record) error {
				committed = rec.RecoveryPoint
				resp := workflow.Problem(http.StatusInternalServerError, "the operation was stopped and will not be retried")
				cause := "failed by an operator: " + reason
				if force && rec.Status == recovery.StatusInFlight {
					return seam.StoreOf(store).ForceFail(cmd.Context(), rec.Fence(), resp, cause)
				}
				return seam.StoreOf(store).FailLeaseOver(cmd.Context(), rec.Fence(), resp, cause)
			}, "failed")
			if err == nil && committed != "" {
				fmt.Fprintf(opts.stdout, "the steps committed up to %s stay committed: nothing was undone\n", printable(committed))
			}
			return err
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "no reason given", "why, kept as the key's last error")
	cmd.Flags().BoolVar(&force, "force", false, "fail the key even though its lease is still valid")
	return cmd
}

// onInFlight loads key and applies change, fenced by the owner token it
// read: if the key changed hands meanwhile, nothing is written. A key whose
// lease is valid by the database clock is left alone unless force: it is
// refused here with the time left, and change, unless force, writes with
// the lease's end in its statement's WHERE, so that a holder renewing
// between this read and the write keeps the key (ErrLeaseLost). A parked
// key holds no lease: change writes to it with the operator's fence (the
// key still parked) whether or not force is given.
func (o *options) onInFlight(cmd *cobra.Command, key recovery.Key, force bool, change func(*recovery.Store, *recovery.Record) error, verb string) error {
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
	if rec.Finished() {
		return fmt.Errorf("key %q of tenant %q is %s: nothing to change", key.ID, key.Tenant, rec.Status)
	}
	if !force && !rec.Released && rec.Status != recovery.StatusParked {
		var left time.Duration
		if err := db.QueryRow(ctx, `SELECT $1::timestamptz - clock_timestamp()`, rec.LockedUntil).Scan(&left); err != nil {
			return fmt.Errorf("read the database clock: %w", err)
		}
		if left > 0 {
			return fmt.Errorf("key %q of tenant %q is leased for %s more (until %s): its holder may still be at work; wait for the lease to end, or pass --force",
				key.ID, key.Tenant, left.Round(time.Millisecond), rec.LockedUntil.Format(time.RFC3339Nano))
		}
	}
	if err := change(store, rec); err != nil {
		if errors.Is(err, recovery.ErrLeaseLost) {
			return fmt.Errorf("the key changed while this command ran; look again: %w", err)
		}
		return err
	}
	fmt.Fprintf(o.stdout, "%s key %q of tenant %q\n", verb, key.ID, key.Tenant)
	return nil
}

// store connects and returns the key store and its pool, which the caller
// closes.
func (o *options) store(cmd *cobra.Command) (*recovery.Store, *pgxpool.Pool, error) {
	db, err := o.connect(cmd.Context())
	if err != nil {
		return nil, nil, err
	}
	store, err := recovery.New(db, recovery.Config{Schema: o.schema})
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return store, db, nil
}

// writeHistory prints r's history as a table, oldest first, after a line
// that says how many older transitions were dropped, if any.
func writeHistory(w io.Writer, r *recovery.Record) error {
	fmt.Fprintln(w)
	switch {
	case len(r.History) == 0:
		fmt.Fprintln(w, "history: none recorded")
		return nil
	case r.HistoryTruncated > 0:
		fmt.Fprintf(w, "history: the latest %d transitions (%d older ones dropped)\n", len(r.History), r.HistoryTruncated)
	default:
		fmt.Fprintln(w, "history:")
	}
	t := newTable(w, "AT", "TRANSITION", "OWNER", "STEP", "DETAIL")
	for _, tr := range r.History {
		detail := tr.Error
		if tr.Definition != "" {
			detail = strings.TrimSpace("definition " + tr.Definition + " " + detail)
		}
		t.row(tr.At.Format(time.RFC3339Nano), string(tr.Kind), tr.Owner.String(), tr.Step, shorten(detail, 80))
	}
	return t.flush()
}

func lease(r *recovery.Record) string {
	switch {
	case r.Finished():
		return "none (finished)"
	case r.Status == recovery.StatusParked:
		return "none (parked)"
	case r.Released:
		return "released"
	default:
		return r.LockedUntil.Format(time.RFC3339Nano)
	}
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
