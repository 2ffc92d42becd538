package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/onceflow/onceflow/idemclient"
	"github.com/onceflow/onceflow/internal/pgcluster"
	"github.com/onceflow/onceflow/recovery"
)

const demoBody = `{"customer_id":"cus_ada","amount_cents":4200,"currency":"usd","card_token":"tok_visa","items":[{"sku":"book","qty":1}]}`

// demo tells onceflow's story in a dozen lines: a checkout server dies right
// after charging the card; the client retries with the same key; the retry
// resumes after the last committed step, and the card is charged once.
func demo(ctx context.Context, out io.Writer) error {
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		return err
	}
	defer cluster.Stop()
	provider := newProvider()
	srv, providerAddr, err := listen(ctx, "127.0.0.1:0", provider.routes(), defaultLimits)
	if err != nil {
		return err
	}
	defer shutdown(srv)
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	keys, err := os.MkdirTemp("", "checkout-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(keys)
	client, err := newDemoClient(out)
	if err != nil {
		return err
	}
	keysFile := filepath.Join(keys, "api-keys")
	if err := os.WriteFile(keysFile, []byte(client.token+" "+demoClientTenant+"\n"), 0o600); err != nil {
		return err
	}
	common := []string{"--database-url", cluster.URL(), "--provider-url", "http://" + providerAddr, "--lease", "2s", "--sweep-every", "1h",
		"--api-keys", keysFile}
	say("• started a throwaway PostgreSQL and a fake payment provider")
	say("• the client is tenant %s; every request sends Authorization: Bearer %s", demoClientTenant, client.token)

	server, err := startServe(ctx, exe, append(common, "--crash-after", "charge")...)
	if err != nil {
		return err
	}
	defer server.Kill() // on the way out, whatever happened
	key := demoKey()
	say("• POST /v1/checkouts  Idempotency-Key: %s  (the server will die right after the charge)", key)
	gaveUp, err := client.untilExit(ctx, server, key)
	if err != nil {
		return err
	}
	say("  → no answer: the server exited with code %d before recording the charge", server.Wait())
	say("  → the client stops retrying (%d attempt) and keeps the key for later, as a job queue would", gaveUp.Attempts)

	db, err := openDatabase(ctx, cluster.URL())
	if err != nil {
		return err
	}
	defer db.Close()
	store, _ := recovery.New(db, recovery.Config{})
	rec, err := store.Load(ctx, recovery.Key{Tenant: demoClientTenant, ID: key})
	if err != nil {
		return err
	}
	charges, requests := provider.counts()
	say("• the key is %s, recovery point %q; the provider made %d charge (%d request)", rec.Status, rec.RecoveryPoint, charges, requests)

	server, err = startServe(ctx, exe, common...)
	if err != nil {
		return err
	}
	defer server.Kill()
	say("• restarted the server; the client sends the checkout again with the same key, and %s: wait=%d", idemclient.PreferHeader, demoWaitSeconds)
	first, err := client.post(ctx, server.URL, key)
	if err != nil {
		return err
	}
	if applied := first.header.Get(idemclient.PreferenceAppliedHeader); applied != "" {
		say("  → the server waited for the dead server's lease to run out (%s: %s)", idemclient.PreferenceAppliedHeader, applied)
	}
	say("  → %d %s  (%d attempt)", first.status, first.body, first.attempts)
	var orders int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM checkout_orders`).Scan(&orders); err != nil {
		return err
	}
	charges, requests = provider.counts()
	say("• resumed after %q: %d order, %d charge (the provider saw %d requests with one key)", rec.RecoveryPoint, orders, charges, requests)

	again, err := client.post(ctx, server.URL, key)
	if err != nil {
		return err
	}
	same := again.status == first.status && bytes.Equal(again.body, first.body)
	say("• a second retry → %d, Idempotent-Replayed: %t, identical bytes: %t", again.status, again.replayed, same)
	if first.status != http.StatusCreated || orders != 1 || charges != 1 || !same || !again.replayed {
		return fmt.Errorf("the demo did not go as told: %d, %d orders, %d charges, replayed %t, identical %t", first.status, orders, charges, again.replayed, same)
	}
	say("• one order, one charge, one answer. Done.")
	return nil
}

// demoClientTenant is the demo client's tenant.
const demoClientTenant = "acme"

// demoWaitSeconds is the demo client's Prefer: wait: longer than the
// servers' lease (2s), so that a retry waits for a dead server's lease
// instead of being told 409.
const demoWaitSeconds = 5

// demoClient is the demo's client: an idemclient.Client, with its API key,
// that tells of each retry it waits for.
type demoClient struct {
	token  string
	client *idemclient.Client
}

func newDemoClient(out io.Writer) (demoClient, error) {
	client, err := idemclient.New(idemclient.Config{
		// Each attempt gives up on a server that hangs rather than hang the demo.
		HTTPClient: &http.Client{Timeout: 30 * time.Second},
		Wait:       demoWaitSeconds * time.Second,
		Hooks: idemclient.Hooks{Wait: func(w idemclient.WaitInfo) {
			last := strconv.Itoa(w.Status)
			var urlErr *url.Error
			if errors.As(w.Err, &urlErr) {
				last = "no answer (" + urlErr.Err.Error() + ")"
			}
			fmt.Fprintf(out, "  → %s; the client sends attempt %d in %s\n", last, w.Attempt, w.Delay.Round(time.Millisecond))
		}},
	})
	return demoClient{token: newAPIKey(), client: client}, err
}

// answer is a final answer, read whole.
type answer struct {
	status   int
	header   http.Header
	body     []byte
	replayed bool
	attempts int
}

// request is the demo's checkout with key.
func (c demoClient) request(ctx context.Context, base, key string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/checkouts", strings.NewReader(demoBody))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemclient.KeyHeader, key)
	req.Header.Set("Authorization", "Bearer "+c.token)
	return req, nil
}

// post sends the demo's checkout with key, retrying as idemclient does,
// and reads the final answer.
func (c demoClient) post(ctx context.Context, base, key string) (answer, error) {
	req, err := c.request(ctx, base, key)
	if err != nil {
		return answer{}, err
	}
	resp, err := c.client.Do(ctx, req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxDemoAnswer))
	return answer{resp.StatusCode, resp.Header, body, resp.Replayed, resp.Attempts}, err
}

// maxDemoAnswer bounds the answer the demo reads.
const maxDemoAnswer = 1 << 20

// untilExit sends the demo's checkout with key to a server that dies
// before answering, retrying until the server has exited: then the client
// gives up for now (the *GiveUpError), keeping the key for later.
func (c demoClient) untilExit(ctx context.Context, server *serveProcess, key string) (*idemclient.GiveUpError, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-server.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	_, err := c.post(ctx, server.URL, key)
	var gaveUp *idemclient.GiveUpError
	if !errors.As(err, &gaveUp) {
		return nil, fmt.Errorf("the server answered although it should have died (%v)", err)
	}
	return gaveUp, nil
}

func demoKey() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "demo-" + hex.EncodeToString(b)
}
