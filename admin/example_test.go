package admin_test

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/admin"
	"github.com/onceflow/onceflow/recovery"
)

// Mount the admin API (and the console) in an application behind its own
// authentication, here one token for on-call engineers who may act and one
// for those who may only look, and release a key whose holder died.
func Example() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("ONCEFLOW_DATABASE_URL")) // migrated with package migrations
	if err != nil {
		panic(err)
	}
	defer db.Close()
	stuckKey(ctx, db) // an attempt died holding acme's order-42

	operator, viewer := "s3cret-operator", "s3cret-viewer" // from the application's secrets
	a, err := admin.New(db, admin.Config{
		Authorize: func(r *http.Request) (admin.Role, error) {
			token := []byte(r.Header.Get("Authorization"))
			switch {
			case subtle.ConstantTimeCompare(token, []byte("Bearer "+operator)) == 1:
				return admin.RoleWrite, nil
			case subtle.ConstantTimeCompare(token, []byte("Bearer "+viewer)) == 1:
				return admin.RoleRead, nil
			}
			return admin.RoleNone, errors.New("unknown token")
		},
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", a.Handler()))
	srv := httptest.NewServer(mux) // http.ListenAndServe in an application
	defer srv.Close()

	call := func(method, path, token, body string, out any) string {
		req, _ := http.NewRequest(method, srv.URL+"/ops"+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		if out != nil {
			_ = json.NewDecoder(resp.Body).Decode(out)
		}
		return resp.Status
	}

	var page admin.Page
	call("GET", "/api/keys?status=in_flight", viewer, "", &page)
	r := page.Records[0]
	fmt.Println("stuck:", r.Tenant, r.Key, "at", r.RecoveryPoint)

	body := fmt.Sprintf(`{"owner": %q, "reason": "holder died in the outage"}`, r.Owner)
	fmt.Println("viewer release:", call("POST", "/api/keys/acme/order-42/release", viewer, body, nil))
	fmt.Println("operator release:", call("POST", "/api/keys/acme/order-42/release", operator, body, nil))
	fmt.Println("again, with the old owner:", call("POST", "/api/keys/acme/order-42/release", operator, body, nil))

	// The same from Go.
	d, err := a.Show(ctx, recovery.Key{Tenant: "acme", ID: "order-42"})
	if err != nil {
		panic(err)
	}
	fmt.Println("released:", d.Released, "attempts:", d.Attempts)
	// Output:
	// stuck: acme order-42 at create_order
	// viewer release: 403 Forbidden
	// operator release: 200 OK
	// again, with the old owner: 409 Conflict
	// released: true attempts: 1
}

// stuckKey makes the record of an attempt that committed create_order and
// died: its lease is over.
func stuckKey(ctx context.Context, db *pgxpool.Pool) {
	store, err := recovery.New(db, recovery.Config{})
	if err != nil {
		panic(err)
	}
	k := recovery.Key{Tenant: "acme", ID: "order-42"}
	fp, req, _ := recovery.FingerprintJSON("checkout", []byte(`{"amount": 100}`))
	rec, _, err := store.Claim(ctx, recovery.ClaimParams{Key: k, Workflow: "checkout", Fingerprint: fp, Request: req})
	if err != nil {
		panic(err)
	}
	if err := store.Advance(ctx, rec.Fence(), "create_order", []byte(`{"order_id": 1}`)); err != nil {
		panic(err)
	}
	if err := store.ExpireLease(ctx, k); err != nil {
		panic(err)
	}
}
