//go:build !linux

package main

import (
	"context"
	"errors"
)

// startPostgres starts a throwaway server on Linux only; elsewhere, pass
// --database-url.
func startPostgres(context.Context) (string, func(), error) {
	return "", nil, errors.New("a throwaway server is started on Linux only: pass --database-url")
}
