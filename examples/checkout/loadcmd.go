package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/idemclient"
)

// apiKeyEnv is where load finds the API key serve prints.
const apiKeyEnv = "CHECKOUT_API_KEY"

func newLoadCmd() *cobra.Command {
	var (
		cfg        = loadConfig{Intents: 100, Concurrency: 16, Redrive: true}
		apiKeyFile string
		wait       time.Duration
		asJSON     bool
	)
	cmd := &cobra.Command{
		Use:   "load --url URL",
		Short: "Drive a running checkout server with many checkouts, each retried under its own key",
		Long: `load makes --intents checkouts against the checkout server at --url, --concurrency at
once, each under its own Idempotency-Key, through one idemclient.Client: every intent
retries with its key, and all share one retry budget (--budget-ratio, --budget-burst).
An intent that gave up for the budget, its attempts or its deadline is sent again at the
end with the same key (--redrive, up to 3 times), as a job queue would; the server
answers it from its record if it had done it. Then load prints a summary (--json for
machines). Interrupted (Ctrl-C), it stops and prints what it has. It exits 1 when an
intent gave up or was not started.

The API key is --api-key, else the first word of --api-key-file (a bare key, or serve's
--api-keys file: its first line's token, so that line's tenant), else $CHECKOUT_API_KEY,
as serve prints it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key, err := apiKeyFrom(cfg.APIKey, apiKeyFile)
			if err != nil {
				return err
			}
			cfg.APIKey = key
			cfg.Client.Wait = wait
			if wait == 0 {
				cfg.Client.Wait = -1 // no Prefer
			}
			report, err := runLoad(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				err = enc.Encode(report)
			} else {
				printReport(cmd.OutOrStdout(), report)
			}
			if err == nil && report.GaveUp+report.NotStarted > 0 {
				err = fmt.Errorf("load: %d intents gave up and %d were not started", report.GaveUp, report.NotStarted)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.URL, "url", "http://127.0.0.1:8080", "the checkout server's base URL")
	f.StringVar(&cfg.APIKey, "api-key", "", "API key, sent as Authorization: Bearer (default: --api-key-file, else $"+apiKeyEnv+")")
	f.StringVar(&apiKeyFile, "api-key-file", "", "file whose first word is the API key (a bare key, or serve's --api-keys file)")
	f.IntVar(&cfg.Intents, "intents", cfg.Intents, fmt.Sprintf("checkouts to make, each under its own key (at most %d)", maxLoadIntents))
	f.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, fmt.Sprintf("checkouts at once (at most %d)", maxLoadConcurrency))
	f.DurationVar(&wait, "wait", idemclient.WaitDefault, "send Prefer: wait=N: a duplicate in flight waits this long for the first answer; 0 sends none")
	f.Float64Var(&cfg.Client.Budget.Ratio, "budget-ratio", idemclient.BudgetRatioDefault, "retries allowed per intent, on average, for all intents together")
	f.Float64Var(&cfg.Client.Budget.Burst, "budget-burst", idemclient.BudgetBurstDefault, "retries allowed at once before new intents refill the budget")
	f.DurationVar(&cfg.Client.MaxElapsed, "deadline", idemclient.MaxElapsedDefault, "how long one intent retries, from its first attempt")
	f.IntVar(&cfg.Client.MaxAttempts, "max-attempts", idemclient.MaxAttemptsDefault, "requests per intent, the first included")
	f.Float64Var(&cfg.Declines, "declines", 0, "fraction of intents paid with tok_decline (a final 402)")
	f.BoolVar(&cfg.Redrive, "redrive", cfg.Redrive, "send again, with the same key, the intents that gave up for the budget, attempts or deadline")
	f.BoolVar(&asJSON, "json", false, "print the summary as JSON")
	return cmd
}

// maxKeyFile bounds the API key file load reads.
const maxKeyFile = 1 << 20

// apiKeyFrom is the API key: flag, else the first word of file, else
// $CHECKOUT_API_KEY.
func apiKeyFrom(flag, file string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if file == "" {
		return os.Getenv(apiKeyEnv), nil
	}
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("--api-key-file: %w", err)
	}
	defer f.Close()
	words := bufio.NewScanner(io.LimitReader(f, maxKeyFile))
	words.Split(bufio.ScanWords)
	if !words.Scan() {
		return "", errors.New("--api-key-file: no key in the file")
	}
	return words.Text(), nil
}

// printReport writes the summary for people.
func printReport(w io.Writer, r loadReport) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	if r.Interrupted {
		p("interrupted: what was done so far")
	}
	p("intents        %d in %s: %d succeeded, %d failed (a final answer other than 2xx), %d gave up, %d not started",
		r.Intents, time.Duration(r.ElapsedMS)*time.Millisecond, r.Succeeded, r.Failed, r.GaveUp, r.NotStarted)
	p("final answers  %s", counts(r.Statuses))
	if r.GaveUp > 0 {
		p("gave up by     %s", counts(r.GaveUpBy))
	}
	p("HTTP requests  %d: %d retries; %d answers were replays (Idempotent-Replayed)", r.Attempts, r.Retries, r.Replays)
	p("retry budget   %d retries refused; %d intents re-driven with their key, in %d rounds", r.BudgetRefusals, r.Redrives, r.RedriveRounds)
}

// counts writes m as "k ×n, …", ordered by key.
func counts[K int | string](m map[K]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%v ×%d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
