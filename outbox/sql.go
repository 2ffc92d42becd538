package outbox

import (
	"strings"

	"github.com/onceflow/onceflow/internal/dbschema"
)

const recordColumns = `id, topic, dedupe_key, payload, headers, status, attempts, available_at, last_error,
	created_at, delivered_at`

const (
	// enqueueSQL writes one message, or nothing when its topic and dedupe
	// key exist: DO NOTHING rather than an error, which would abort the
	// caller's transaction. Enqueue reads the rows affected.
	enqueueSQL = `INSERT INTO {outbox} (topic, dedupe_key, payload, headers) VALUES ($1, $2, $3::json, $4::jsonb)
ON CONFLICT (topic, dedupe_key) DO NOTHING`

	markProcessedSQL = `INSERT INTO {processed} (consumer, dedupe_key) VALUES ($1, $2)
ON CONFLICT (consumer, dedupe_key) DO NOTHING`

	// takeSQL hides a batch of due messages of the relay's topics for a
	// lease, counts the attempt and marks the take with a token. SKIP LOCKED
	// lets relays share the work. $1 batch size, $2 lease in microseconds,
	// $3 topics, $4 the take's token.
	takeSQL = `UPDATE {outbox} SET available_at = clock_timestamp() + $2::bigint * interval '1 microsecond',
    attempts = attempts + 1, lease_token = $4
WHERE id IN (
    SELECT id FROM {outbox}
    WHERE status = 'pending' AND available_at <= clock_timestamp() AND topic = ANY($3)
    ORDER BY available_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
RETURNING ` + recordColumns

	// The outcome of a delivery is written only if the message is still as
	// the relay took it: pending, under the take's token, its lease not run
	// out (else another relay may be delivering it).
	taken = `id = $1 AND lease_token = $2 AND status = 'pending' AND available_at > clock_timestamp()`

	deliveredSQL = `UPDATE {outbox} SET status = 'delivered', delivered_at = clock_timestamp(), last_error = NULL,
    lease_token = NULL
WHERE ` + taken

	retryLaterSQL = `UPDATE {outbox} SET available_at = clock_timestamp() + $3::bigint * interval '1 microsecond',
    last_error = $4, lease_token = NULL
WHERE ` + taken

	deadSQL = `UPDATE {outbox} SET status = 'dead', last_error = $3, lease_token = NULL
WHERE ` + taken

	// giveBack makes a taken message available at once; the attempt it
	// was taken at is not counted.
	giveBackSQL = `UPDATE {outbox} SET available_at = clock_timestamp(), attempts = attempts - 1, lease_token = NULL
WHERE ` + taken

	listSQL = `SELECT ` + recordColumns + ` FROM {outbox}
WHERE ($1 = '' OR status = $1) AND ($2 = '' OR topic = $2) AND id > $4
ORDER BY id LIMIT $3`

	// retrySQL revives a dead message, or one waiting out a backoff; never
	// one a relay holds (taken, its lease not run out).
	retrySQL = `UPDATE {outbox} SET status = 'pending', attempts = 0, available_at = clock_timestamp(),
    last_error = NULL, lease_token = NULL
WHERE id = $1 AND (status = 'dead'
    OR (status = 'pending' AND (lease_token IS NULL OR available_at <= clock_timestamp())))`
)

type queries struct {
	enqueue, markProcessed, take, delivered, retryLater, dead, giveBack, list, retry string
}

func newQueries(schema string) *queries {
	expand := func(sql string) string {
		sql = strings.NewReplacer("{outbox}", "{schema}.onceflow_outbox", "{processed}", "{schema}.onceflow_processed").Replace(sql)
		return dbschema.Expand(sql, schema)
	}
	return &queries{
		enqueue:       expand(enqueueSQL),
		markProcessed: expand(markProcessedSQL),
		take:          expand(takeSQL),
		delivered:     expand(deliveredSQL),
		retryLater:    expand(retryLaterSQL),
		dead:          expand(deadSQL),
		giveBack:      expand(giveBackSQL),
		list:          expand(listSQL),
		retry:         expand(retrySQL),
	}
}
