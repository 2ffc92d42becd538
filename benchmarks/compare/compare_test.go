package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// testServer is one throwaway server for the package's tests.
func testServer(t *testing.T) *server {
	t.Helper()
	srv, err := startServer(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.close)
	return srv
}

func TestTheThrowawayServerCommitsDurably(t *testing.T) {
	srv := testServer(t)
	desc, err := srv.describe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"fsync=on", "full_page_writes=on", "synchronous_commit=on"} {
		if !strings.Contains(desc, s) {
			t.Errorf("server settings %q lack %s", desc, s)
		}
	}
}

// TestEachSideRunsExactlyItsOrders runs every side a few times, one at a
// time and then several at once, and checks that its database holds one
// paid order for each key it ran and nothing else.
func TestEachSideRunsExactlyItsOrders(t *testing.T) {
	const sequential, concurrent, workers = 3, 12, 4
	srv := testServer(t)
	built, err := buildSides(t.Context(), srv, workers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeSides(built) })
	for _, s := range built {
		t.Run(s.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			var want []string
			for i := range sequential {
				key := fmt.Sprintf("one-%d", i)
				want = append(want, key)
				if err := s.run(ctx, key); err != nil {
					t.Fatal(err)
				}
			}
			var wg sync.WaitGroup
			errs := make(chan error, concurrent)
			for i := range concurrent {
				key := fmt.Sprintf("many-%d", i)
				want = append(want, key)
				wg.Go(func() { errs <- s.run(ctx, key) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			got, err := paidOrders(ctx, s.db)
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("orders by key and status:\n got %v\nwant %v (each once, paid)", got, want)
			}
		})
	}
}

// paidOrders lists the keys of db's orders, sorted, one entry per order;
// an order that is not paid is listed with its status.
func paidOrders(ctx context.Context, db *database) ([]string, error) {
	rows, err := db.pool.Query(ctx, `SELECT key, status FROM bench_orders ORDER BY key, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var key, status string
		if err := rows.Scan(&key, &status); err != nil {
			return nil, err
		}
		if status != "paid" {
			key += " (" + status + ")"
		}
		keys = append(keys, key)
	}
	return keys, rows.Err()
}

// TestTheFloorCommitsTwicePerWorkflow checks the commit count against the
// one side whose count is known: two transactions per workflow.
func TestTheFloorCommitsTwicePerWorkflow(t *testing.T) {
	srv := testServer(t)
	db, err := srv.newDatabase(t.Context(), "floor", 4+spareConns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.pool.Close)
	floor, err := newFloor(t.Context(), db, 4)
	if err != nil {
		t.Fatal(err)
	}
	floor.name = "floor"
	k := &keys{prefix: "floor"}
	for _, c := range []int{1, 4} {
		n, _, commits, err := measure(t.Context(), srv, floor, k, c, 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if commits != 2*n {
			t.Errorf("concurrency %d: %d commits for %d workflows, want %d", c, commits, n, 2*n)
		}
	}
}
