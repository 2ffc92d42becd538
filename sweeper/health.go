package sweeper

import (
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// Pinger checks a database connection; *pgxpool.Pool satisfies it.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Health answers 200 {"status":"ok"} while db answers a ping within two
// seconds, and 503 {"status":"unavailable"} otherwise: a liveness and
// readiness endpoint for a sweeper process. The driver's error is not
// shown; it may name hosts.
func Health(db Pinger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		if err := db.Ping(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]string{"status": "unavailable"})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"status": "ok"})
	})
}
