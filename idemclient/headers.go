package idemclient

// The header names of the Idempotency-Key protocol, as package idemhttp
// speaks it.
const (
	// KeyHeader carries the idempotency key on a request.
	KeyHeader = "Idempotency-Key"

	// ReplayedHeader is "true" on a response the server replayed from its
	// record instead of running the request again.
	ReplayedHeader = "Idempotent-Replayed"

	// ExpiresHeader is an HTTP-date (IMF-fixdate) on a response: the server
	// keeps the key's record at least until then. A retry after it may run
	// as a new request.
	ExpiresHeader = "Idempotency-Key-Expires"

	// PreferHeader carries the client's preferences (RFC 7240); the client
	// sends "wait=N", the seconds it is willing to wait for the answer.
	PreferHeader = "Prefer"

	// PreferenceAppliedHeader names the preferences the server honoured.
	PreferenceAppliedHeader = "Preference-Applied"
)
