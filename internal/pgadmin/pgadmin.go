// Package pgadmin creates, migrates and drops whole databases on a
// PostgreSQL server: what a test harness needs to give each test, or each
// crashtest world, a database of its own. Package dbtest (the repository's
// own tests) and package crashtest (users' tests) both build on it.
package pgadmin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/migrations"
)

// StatementTimeout bounds each administrative statement, connection
// included.
const StatementTimeout = time.Minute

// CreateDatabase creates database name on the server adminURL connects to,
// as a copy of template when template is not empty.
func CreateDatabase(ctx context.Context, adminURL, name, template string) error {
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		sql += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	return Exec(ctx, adminURL, sql)
}

// DropDatabase drops database name, ending the sessions still connected to
// it. A database that does not exist is not an error.
func DropDatabase(ctx context.Context, adminURL, name string) error {
	return Exec(ctx, adminURL, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// Exec runs one statement on a short-lived connection to adminURL.
func Exec(ctx context.Context, adminURL, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, StatementTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", Redact(adminURL), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

// Migrate applies every migration of package migrations to the database
// url names, in its default schema.
func Migrate(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", Redact(url), err)
	}
	defer conn.Close(ctx)
	m, err := migrations.New(conn, migrations.Config{})
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// DatabaseURL returns base with its database replaced by name. It accepts
// both URL and keyword/value connection strings.
func DatabaseURL(base, name string) string {
	if strings.HasPrefix(base, "postgres://") || strings.HasPrefix(base, "postgresql://") {
		u, err := url.Parse(base)
		if err == nil {
			u.Path = "/" + name
			return u.String()
		}
	}
	// In keyword/value form the last dbname wins.
	return base + " dbname=" + name
}

// UniqueName returns prefix and 12 random hex digits: a database name no
// other test binary sharing the server picks.
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// Redact returns connString fit for an error message: a URL with its
// password masked, or a placeholder for the keyword/value form, which may
// hold a password anywhere.
func Redact(connString string) string {
	u, err := url.Parse(connString)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "the database server"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}
