package idemhttp

import (
	"net/http"
	"time"
)

// ExpiresHeader is the response header that says, as an HTTP-date (the
// IMF-fixdate of Expires), the earliest moment the server may forget the
// request's key: once it has passed, the key may name a new request. The
// IETF idempotency-key draft defines no such header.
//
// Every answer about a key whose record exists carries it: the handler's
// own response once stored, a replay, 409 while the key is in flight (or
// its answer was lost to a takeover), and a workflow's 500 (failed
// part-way) and 503 (deferred), which leave the key resumable. For a
// replay it is the record's completion plus the key lifetime
// (Config.KeyLifetime); for the handler's stored answer, the moment its
// completion was sent plus the key lifetime (a workflow's: the moment its
// run began); for the others, now plus the key lifetime, since the record
// finishes later and is kept that long after. Every one is a moment of
// this process's clock, which Date reads too: the pruner forgets a record
// by the database's clock, so a replay's completion is placed on this
// clock by how long ago the record finished as the database tells it
// (recovery.Record.FinishedFor), never by the database's reading of it,
// which is off by however far the two clocks are apart. Answers where no
// record is kept, or where the caller may learn nothing of it, carry none:
// 400, 401, 403, 408, 413, 422 (another request's record: use a new key),
// 503 without the database or for a parked record (kept until an operator
// acts), responses that are not stored, and requests without a key. The
// stored response never holds it (recovery.Store does not store it).
const ExpiresHeader = "Idempotency-Key-Expires"

// expires sets ExpiresHeader on w: the key lifetime after finished, a
// moment of this process's clock no later than the record's completion,
// or, when finished is zero (the record finishes later), after now. A
// negative key lifetime sets nothing.
func (c *core) expires(w http.ResponseWriter, finished time.Time) {
	if c.keyLifetime < 0 {
		return
	}
	if finished.IsZero() {
		finished = time.Now()
	}
	w.Header().Set(ExpiresHeader, finished.Add(c.keyLifetime).UTC().Format(http.TimeFormat))
}
