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
	"os"
	"path/filepath"
	"strconv"
	"time"

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
	client := demoClient{token: newAPIKey()}
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
	if _, err := client.post(ctx, server.URL, key); err == nil {
		return errors.New("the server answered although it should have died")
	}
	say("  → no answer: the server exited with code %d before recording the charge", server.Wait())

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
	say("• restarted the server; the client retries with the same key")
	first, err := client.retryUntilDone(ctx, server.URL, key, say)
	if err != nil {
		return err
	}
	say("  → %d %s", first.status, first.body)
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
	say("• a second retry → %d, Idempotent-Replayed: %s, identical bytes: %t", again.status, again.replayed, same)
	if orders != 1 || charges != 1 || !same || again.replayed != "true" {
		return fmt.Errorf("the demo did not go as told: %d orders, %d charges, replayed %q, identical %t", orders, charges, again.replayed, same)
	}
	say("• one order, one charge, one answer. Done.")
	return nil
}

// demoClientTenant is the demo client's tenant.
const demoClientTenant = "acme"

// demoClient is the demo's client, with its API key.
type demoClient struct{ token string }

// demoHTTP gives up on a server that hangs rather than hang the demo.
var demoHTTP = &http.Client{Timeout: 30 * time.Second}

type answer struct {
	status     int
	body       []byte
	replayed   string
	retryAfter string
}

// post sends the demo's checkout with key.
func (c demoClient) post(ctx context.Context, base, key string) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/checkouts", bytes.NewReader([]byte(demoBody)))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := demoHTTP.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed"), resp.Header.Get("Retry-After")}, err
}

// retryUntilDone posts until the answer is not 409, waiting as Retry-After
// says, as a well-behaved client does.
func (c demoClient) retryUntilDone(ctx context.Context, base, key string, say func(string, ...any)) (answer, error) {
	for range 30 {
		a, err := c.post(ctx, base, key)
		if err != nil || a.status != http.StatusConflict {
			return a, err
		}
		wait, _ := strconv.Atoi(a.retryAfter)
		say("  → 409: the dead server's lease has not run out yet; Retry-After: %ds", wait)
		select {
		case <-time.After(time.Duration(max(wait, 1)) * time.Second):
		case <-ctx.Done():
			return answer{}, ctx.Err()
		}
	}
	return answer{}, errors.New("still in flight after 30 retries")
}

func demoKey() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "demo-" + hex.EncodeToString(b)
}
