package idemhttp_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/recovery"
)

// newDocuments returns a pool whose database has shop.documents, a
// versioned table, holding document 1 at version 1.
func newDocuments(t *testing.T) *pgxpool.Pool {
	t.Helper()
	t.Parallel()
	db := dbtest.NewPool(t, 4)
	_, err := db.Exec(context.Background(), `
		CREATE SCHEMA shop;
		CREATE TABLE shop.documents (id bigint PRIMARY KEY, title text NOT NULL, body text, version bigint NOT NULL DEFAULT 1);
		INSERT INTO shop.documents (id, title) VALUES (1, 'first');`)
	require.NoError(t, err)
	return db
}

// document reads document 1.
func document(t *testing.T, db *pgxpool.Pool) (title string, body *string, version int64) {
	t.Helper()
	require.NoError(t, db.QueryRow(context.Background(), `SELECT title, body, version FROM shop.documents WHERE id = 1`).
		Scan(&title, &body, &version))
	return title, body, version
}

func TestVersionedUpdate(t *testing.T) {
	db := newDocuments(t)
	ctx := context.Background()

	version, err := idemhttp.VersionedUpdate(ctx, db, "shop.documents", 1, 1, map[string]any{"title": "second", "body": "text"})
	require.NoError(t, err)
	require.Equal(t, int64(2), version)
	title, body, version := document(t, db)
	require.Equal(t, "second", title)
	require.Equal(t, "text", *body)
	require.Equal(t, int64(2), version)

	_, err = idemhttp.VersionedUpdate(ctx, db, "shop.documents", 1, 1, map[string]any{"title": "stale"})
	require.ErrorIs(t, err, idemhttp.ErrVersionMismatch)
	require.ErrorIs(t, err, idemhttp.ErrPreconditionFailed, "a handler answers it 412")
	_, err = idemhttp.VersionedUpdate(ctx, db, "shop.documents", 1, 3, map[string]any{"title": "ahead"})
	require.ErrorIs(t, err, idemhttp.ErrVersionMismatch)
	_, err = idemhttp.VersionedUpdate(ctx, db, "shop.documents", 2, 2, map[string]any{"title": "missing"})
	require.ErrorIs(t, err, idemhttp.ErrNotFound)
	require.NotErrorIs(t, err, idemhttp.ErrPreconditionFailed)
	title, _, version = document(t, db)
	require.Equal(t, "second", title, "refused updates change nothing")
	require.Equal(t, int64(2), version)

	hostile := `x'); DROP TABLE shop.documents; --`
	version, err = idemhttp.VersionedUpdate(ctx, db, "shop.documents", 1, 2, map[string]any{"title": hostile, "body": nil})
	require.NoError(t, err)
	require.Equal(t, int64(3), version)
	title, body, _ = document(t, db)
	require.Equal(t, hostile, title, "values are parameters, stored as sent")
	require.Nil(t, body)
}

// TestVersionedUpdateRefusesBadNames: names that are not plain identifiers,
// injection attempts among them, and the columns the compare-and-set owns
// are refused before any statement runs.
func TestVersionedUpdateRefusesBadNames(t *testing.T) {
	db := newDocuments(t)
	ctx := context.Background()
	for _, tc := range []struct {
		table string
		set   map[string]any
	}{
		{"shop.documents", map[string]any{`title" = 'x', "version" = 1 --`: "x"}},
		{"shop.documents", map[string]any{`title = 'x'; DROP TABLE shop.documents; --`: "x"}},
		{"shop.documents", map[string]any{"title\x00": "x"}},
		{"shop.documents", map[string]any{"body": "x", "version": 9}},
		{"shop.documents", map[string]any{"id": 2}},
		{"shop.documents", map[string]any{"shop.title": "x"}},
		{"shop.documents", map[string]any{"": "x"}},
		{"shop.documents", map[string]any{"1title": "x"}},
		{"shop.documents", map[string]any{"títle": "x"}},
		{"shop.documents", map[string]any{string(make([]byte, 64)): "x"}},
		{"shop.documents", map[string]any{}},
		{"shop.documents", nil},
		{`shop.documents SET title = 'x' --`, map[string]any{"title": "x"}},
		{`shop.documents"; DROP TABLE shop.documents; --`, map[string]any{"title": "x"}},
		{"a.shop.documents", map[string]any{"title": "x"}},
		{".documents", map[string]any{"title": "x"}},
		{"", map[string]any{"title": "x"}},
	} {
		_, err := idemhttp.VersionedUpdate(ctx, db, tc.table, 1, 1, tc.set)
		require.ErrorIs(t, err, recovery.ErrInvalidInput, "%q %q", tc.table, tc.set)
	}
	title, _, version := document(t, db)
	require.Equal(t, "first", title)
	require.Equal(t, int64(1), version)

	var tables int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'shop'`).Scan(&tables))
	require.Equal(t, 1, tables)
}

// TestVersionedUpdateConcurrent: two transactions update document 1 from
// version 1. The second waits for the first's lock; when the first commits,
// the second gets ErrVersionMismatch, and when it rolls back instead, the
// second succeeds. The second is known to be waiting from pg_stat_activity,
// not from a sleep.
func TestVersionedUpdateConcurrent(t *testing.T) {
	for _, firstCommits := range []bool{true, false} {
		name := map[bool]string{true: "first commits", false: "first rolls back"}[firstCommits]
		t.Run(name, func(t *testing.T) {
			db := newDocuments(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			first, err := db.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = first.Rollback(ctx) }()
			second, err := db.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = second.Rollback(ctx) }()
			var secondPID int32
			require.NoError(t, second.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&secondPID))

			_, err = idemhttp.VersionedUpdate(ctx, first, "shop.documents", 1, 1, map[string]any{"title": "by first"})
			require.NoError(t, err)
			type result struct {
				version int64
				err     error
			}
			done := make(chan result, 1)
			go func() {
				v, err := idemhttp.VersionedUpdate(ctx, second, "shop.documents", 1, 1, map[string]any{"title": "by second"})
				done <- result{v, err}
			}()
			require.Eventually(t, func() bool { return waitsForALock(ctx, db, secondPID) }, 30*time.Second, 10*time.Millisecond,
				"the second update waits for the first's row lock")
			select {
			case r := <-done:
				t.Fatalf("the second update returned while the first held the row: %d, %v", r.version, r.err)
			default:
			}

			if firstCommits {
				require.NoError(t, first.Commit(ctx))
				r := <-done
				require.ErrorIs(t, r.err, idemhttp.ErrVersionMismatch)
				require.NoError(t, second.Rollback(ctx))
				title, _, version := document(t, db)
				require.Equal(t, "by first", title)
				require.Equal(t, int64(2), version)
				return
			}
			require.NoError(t, first.Rollback(ctx))
			r := <-done
			require.NoError(t, r.err)
			require.Equal(t, int64(2), r.version)
			require.NoError(t, second.Commit(ctx))
			title, _, _ := document(t, db)
			require.Equal(t, "by second", title)
		})
	}
}

// waitsForALock reports whether the backend pid waits for a lock.
func waitsForALock(ctx context.Context, db *pgxpool.Pool, pid int32) bool {
	var waiting bool
	err := db.QueryRow(ctx, `SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting)
	return err == nil && waiting
}
