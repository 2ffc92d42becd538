// Command checkout is onceflow's example service: a checkout API whose
// create-order, charge, record-charge workflow survives crashes and retries
// without charging twice (and refunds, once, a charge it cannot keep), a
// fake payment provider, and a demo that tells the story.
//
//	checkout demo                 the story, on a throwaway PostgreSQL
//	checkout serve [flags]        the checkout API
//	checkout provider [--addr]    the fake payment provider
//	checkout load --url URL       many checkouts at once against a running server, retried under their keys
//	checkout workflows export     its workflow definitions, for onceflow workflows diff
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "checkout:", err)
		stop()
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "checkout",
		Short:         "onceflow's example checkout service",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	var f serveFlags
	serveCmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the checkout API",
		Long: `serve runs POST /v1/checkouts (create_order, then charge at the payment provider,
then record_charge, which also enqueues a receipt) and GET /v1/orders/{order_id},
with a sweeper that finishes checkouts whose client went away and sends receipts.
When the provider charged another amount than the order's, record_charge cancels
the order and the charge is refunded: the answer is a stored 502.

Every request is authenticated: with --api-keys FILE, by its bearer token (each
line of FILE is "TOKEN TENANT"; an X-Tenant-ID header is ignored); with
--trust-tenant-header, by the X-Tenant-ID header an authenticating proxy sets.
With neither, serve makes one API key for tenant demo and prints it as
"export CHECKOUT_API_KEY=...". A missing or unknown key is 401.

With --operator-token-file FILE, the operators' console (package admin) is at
/ops/: the token in FILE (24 characters or more) opens it read-write, as a bearer
token or, in a browser, as the password; a tenant's API key is refused (403).

Without --database-url, serve starts a throwaway PostgreSQL, which it stops on
exit, and prints its URL as "export ONCEFLOW_DATABASE_URL=...", for the
onceflow command (onceflow keys list, onceflow outbox list).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(cmd.Context(), f, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	flags := serveCmd.Flags()
	flags.StringVar(&f.addr, "addr", "127.0.0.1:8080", "address to listen on")
	flags.StringVar(&f.databaseURL, "database-url", "", "PostgreSQL URL (default: a throwaway PostgreSQL started for this run)")
	flags.StringVar(&f.providerURL, "provider-url", "", "payment provider URL (default: a fake provider started in-process)")
	flags.DurationVar(&f.lease, "lease", recovery.LeaseDefault, "how long an attempt holds a checkout's key")
	flags.StringVar(&f.deriveKeysFrom, "derive-keys-from", foreign.FromRecord.String(), "what the provider's keys derive from besides the client's key: record (new keys for a key reused after pruning) or client-key (the same keys for a record lost in a failover to an asynchronous standby)")
	flags.DurationVar(&f.dbTimeout, "db-timeout", workflow.DBTimeoutDefault, "how long a request waits for a connection and its claim before it is answered 503")
	flags.DurationVar(&f.sweepEvery, "sweep-every", 10*time.Second, "how often the sweeper finishes abandoned checkouts and sends receipts")
	flags.StringVar(&f.crashAfter, "crash-after", "", "exit at once (code 3) right after this step: create_order, charge or record_charge")
	flags.StringVar(&f.crashAt, "crash-at", "", `exit at once (code 3) at this crash point, e.g. "after charge's compensation call" (the refund's)`)
	flags.StringVar(&f.stopAfter, "stop-after", "", "for tests: stop (SIGSTOP to itself) once right after this step, until a SIGCONT")
	flags.StringVar(&f.apiKeys, "api-keys", "", "file of API keys, one \"TOKEN TENANT\" a line; requests send Authorization: Bearer TOKEN (default: one new key for tenant demo, printed)")
	flags.StringVar(&f.operatorTokenFile, "operator-token-file", "", "file holding the operators' token: it opens the console at /ops/, read-write (default: the console is off)")
	flags.BoolVar(&f.trustTenantHeader, "trust-tenant-header", false, "take the tenant from the X-Tenant-ID header instead of an API key: only behind a proxy that authenticates clients and sets it")
	flags.DurationVar(&f.limits.read, "read-timeout", defaultLimits.read, "how long a client may take to send a request (its headers: at most 10s of it)")
	flags.DurationVar(&f.limits.write, "write-timeout", defaultLimits.write, "how long a request may take from its headers read to its answer written")

	var providerAddr string
	providerCmd := &cobra.Command{
		Use:   "provider",
		Short: "Run the fake payment provider",
		Long: `provider serves POST /charges, which deduplicates by Idempotency-Key (the same key
answers the same; the same key with another body is 422; card tok_decline is 402;
card tok_wrong_amount is charged one cent more than asked), POST /refunds, which
refunds the charge {"charge_idempotency_key": KEY} once, deduplicated by its own
Idempotency-Key (404 when no charge was made with KEY, which then refuses a charge
with KEY, 409; 409 when the charge was refunded already), and GET /charges, which
lists every charge made, with its refund.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			srv, addr, err := listen(cmd.Context(), providerAddr, newProvider().routes(), defaultLimits)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "listening on http://%s\n", addr)
			<-cmd.Context().Done()
			shutdown(srv)
			return nil
		},
	}
	providerCmd.Flags().StringVar(&providerAddr, "addr", "127.0.0.1:8081", "address to listen on")

	demoCmd := &cobra.Command{
		Use:   "demo",
		Short: "Crash a checkout after the charge, retry it, and show it charged once",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return demo(cmd.Context(), cmd.OutOrStdout()) },
	}
	root.AddCommand(serveCmd, providerCmd, demoCmd, newLoadCmd(), newWorkflowsCmd())
	return root
}
