package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/admin"
	"github.com/onceflow/onceflow/workflow"
)

// The operators' console is mounted at /ops/ behind the checkout's own
// authentication: the operator token of --operator-token-file may act
// (read-write); a tenant's API key is known but refused (403), since the
// console shows every tenant's checkouts; anything else is 401, with the
// challenge that makes a browser ask for the token as a password.

// consolePrefix is where serve mounts the console.
const consolePrefix = "/ops"

// loadOperatorToken reads the operator token from path: the file's one
// line.
func loadOperatorToken(path string) (*admin.Tokens, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--operator-token-file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if strings.ContainsAny(token, " \t\n") {
		return nil, fmt.Errorf("--operator-token-file %s: want one token on one line", path)
	}
	ops, err := admin.ParseTokens(strings.NewReader(token + " write\n"))
	if err != nil {
		return nil, fmt.Errorf("--operator-token-file %s: %w", path, err)
	}
	return ops, nil
}

// operatorAuth is the console's Authorize: read-write for the operator
// token, forbidden for a request tenants authenticates, 401 otherwise.
func operatorAuth(ops *admin.Tokens, tenants authenticator) func(*http.Request) (admin.Role, error) {
	return func(r *http.Request) (admin.Role, error) {
		role, err := ops.Authorize(r)
		if err == nil {
			return role, nil
		}
		if _, tenantErr := tenants(r); tenantErr == nil {
			return admin.RoleNone, fmt.Errorf("%w: a tenant's API key does not open the operators' console", admin.ErrForbidden)
		}
		return admin.RoleNone, err
	}
}

// operatorsFrom is the operator token of --operator-token-file; nil
// without the flag: the console is off.
func operatorsFrom(f serveFlags) (*admin.Tokens, error) {
	if f.operatorTokenFile == "" {
		return nil, nil
	}
	return loadOperatorToken(f.operatorTokenFile)
}

// mountConsole adds the console to mux at /ops/ for the operators ops
// lets in, and says so; with no operators the console is off.
func mountConsole(mux *http.ServeMux, ops *admin.Tokens, db *pgxpool.Pool, engine *workflow.Engine, tenants authenticator, logger *slog.Logger) error {
	if ops == nil {
		logger.Info("no --operator-token-file: the operators' console is off")
		return nil
	}
	console, err := admin.New(db, admin.Config{Authorize: operatorAuth(ops, tenants), Engine: engine, Logger: logger})
	if err != nil {
		return err
	}
	mux.Handle(consolePrefix+"/", admin.Challenge("checkout operators", http.StripPrefix(consolePrefix, console.Handler())))
	logger.Info("the operators' console is at " + consolePrefix + "/")
	return nil
}
