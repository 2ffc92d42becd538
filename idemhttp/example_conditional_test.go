package idemhttp_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/onceflow/onceflow/idemhttp"
)

// A PATCH names the version it read with If-Match; CheckPreconditions
// compares it with the row's current version, and WritePrecondition
// answers a failure. Make the write itself conditional on the version too,
// with VersionedUpdate, in the handler's transaction.
func ExampleCheckPreconditions() {
	current := idemhttp.ETag(7) // the row's version column, read in the handler's transaction
	for _, ifMatch := range []string{"", `"v7"`, `"v6"`, `"v6", "v7"`, "*"} {
		r := httptest.NewRequest(http.MethodPatch, "/v1/orders/ord_1", nil)
		if ifMatch != "" {
			r.Header.Set("If-Match", ifMatch)
		}
		w := httptest.NewRecorder()
		err := idemhttp.CheckPreconditions(r, current, true)
		if !idemhttp.WritePrecondition(w, err) {
			w.WriteHeader(http.StatusOK) // here: VersionedUpdate, then the new ETag and the row
		}
		fmt.Printf("If-Match: %-12s → %d\n", ifMatch, w.Code)
	}
	version, ok := idemhttp.VersionFromETag(current)
	fmt.Println(current, version, ok)
	// Output:
	// If-Match:              → 428
	// If-Match: "v7"         → 200
	// If-Match: "v6"         → 412
	// If-Match: "v6", "v7"   → 200
	// If-Match: *            → 200
	// "v7" 7 true
}
