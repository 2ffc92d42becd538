package main

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPatchWithIfMatchStarIs428: If-Match: * names no version, so a PATCH
// under it, which would overwrite any address it did not see (and apply
// again on a retry), is 428 like one without If-Match, and the order keeps
// its address and its ETag.
//
// Mutation caught: patchOrder checking only that If-Match is there (200,
// the address overwritten, a new ETag).
func TestPatchWithIfMatchStarIs428(t *testing.T) {
	e := newEnv(t)
	app := e.serve("--sweep-every", noSweep)
	id := newPaidOrder(e, app, "k-1")
	tag := e.getOrder(app, id, nil).header.Get("ETag")
	require.Equal(t, http.StatusOK, e.patchAddress(app, "acme", id, tag, addressJSON("1 Main St")).status)
	tag = e.getOrder(app, id, nil).header.Get("ETag")

	for _, star := range []string{"*", " * "} {
		requireProblem(t, e.patchAddress(app, "acme", id, star, addressJSON("2 Other St")), http.StatusPreconditionRequired)
	}
	got := e.getOrder(app, id, nil)
	require.Equal(t, "1 Main St", *decodeOrder(t, got).ShippingAddress)
	require.Equal(t, tag, got.header.Get("ETag"))
}
