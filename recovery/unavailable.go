package recovery

import (
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unavailable reports whether err says the database could not do the work,
// rather than refusing it: ErrUnavailable, a connection lost or refused
// (SQLSTATE class 08, a network error, an unexpected end of the stream), a
// server shutting down or not yet accepting work (57P01, 57P02, 57P03), or
// a server that is read-only (25006: a standby, where a failover left a
// connection; see ReadOnly). What the work wrote is not committed, or, for
// a connection lost during a commit, not known to be: the key's record
// says which, and a retry with the same key finishes it either way (HTTP
// 503 with Retry-After).
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrUnavailable) || errors.Is(err, io.ErrUnexpectedEOF) || ReadOnly(err) {
		return true
	}
	var (
		pgErr      *pgconn.PgError
		connectErr *pgconn.ConnectError
		netErr     net.Error
	)
	switch {
	case errors.As(err, &pgErr):
		return strings.HasPrefix(pgErr.Code, "08") || pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03"
	case errors.As(err, &connectErr), errors.As(err, &netErr):
		return true
	}
	return false
}

// ReadOnly reports whether err is a write the server refused because it
// is read-only (SQLSTATE 25006, read_only_sql_transaction): the connection
// is on a standby, as a failover can leave a pooled connection made before
// it, or one made to a host name that still names the old primary.
func ReadOnly(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25006"
}

// Resetter is a pool that can close its connections and make new ones, as
// *pgxpool.Pool does.
type Resetter interface{ Reset() }

// ResetIfReadOnly resets db's connections when err is a write refused by a
// read-only server (ReadOnly) and db is a Resetter, so that no connection
// stays on a standby: the pool's next connections go where its connection
// string leads (with target_session_attrs=read-write, to the primary). It
// reports whether it reset db.
func ResetIfReadOnly(db any, err error) bool {
	r, ok := db.(Resetter)
	if !ok || !ReadOnly(err) {
		return false
	}
	r.Reset()
	return true
}
