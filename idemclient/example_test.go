package idemclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/onceflow/onceflow/idemclient"
)

// A server that fails the first attempt: the Client retries it with the
// same key and the same body, and returns the final answer.
func ExampleClient_Do() {
	var (
		mu   sync.Mutex
		keys []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get(idemclient.KeyHeader))
		attempt := len(keys)
		mu.Unlock()
		if attempt == 1 {
			w.Header().Set("Retry-After", "0")
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"transfer":"tr_1"}`)
	}))
	defer srv.Close()

	client, err := idemclient.New(idemclient.Config{
		HTTPClient: &http.Client{Timeout: 30 * time.Second}, // above Config.Wait
		BaseDelay:  10 * time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/transfers", strings.NewReader(`{"amount_cents":1250}`))
	if err != nil {
		panic(err)
	}
	resp, err := client.Do(context.Background(), req)
	var gaveUp *idemclient.GiveUpError
	if errors.As(err, &gaveUp) {
		fmt.Println("gave up:", gaveUp.Reason, "keep the key to retry later:", gaveUp.Key)
		return
	}
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("attempts:", resp.Attempts)
	fmt.Println("one key for both:", keys[1] == keys[0] && resp.Key == keys[0])
	// Output:
	// 201 {"transfer":"tr_1"}
	// attempts: 2
	// one key for both: true
}

// Make the key before sending, and store it with the intent: after a
// restart, the intent is sent again with the same key, and the server
// answers from its record instead of doing the work twice.
func ExampleNewKey() {
	done := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idemclient.KeyHeader)
		if done[key] {
			w.Header().Set(idemclient.ReplayedHeader, "true")
		}
		done[key] = true
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	client, err := idemclient.New(idemclient.Config{})
	if err != nil {
		panic(err)
	}

	key := idemclient.NewKey() // store it with the order, in the same transaction
	for range 2 {              // the second time: after a restart
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"order":42}`))
		if err != nil {
			panic(err)
		}
		req.Header.Set(idemclient.KeyHeader, key)
		resp, err := client.Do(context.Background(), req)
		if err != nil {
			panic(err)
		}
		_ = resp.Body.Close()
		fmt.Println(resp.StatusCode, "replayed:", resp.Replayed)
	}
	// Output:
	// 201 replayed: false
	// 201 replayed: true
}
