package bench

import (
	"context"
	"crypto/sha256"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// keyRecord writes a key record by hand in a floor's transactions: one
// insert of an in-flight record in a workflow's first transaction, after
// its business statements, and one update that completes it with its
// response in the last. A floor that writes it measures what any key
// record costs (the bound of a ratio) and what onceflow may add to the
// floor's WAL. A nil *keyRecord writes nothing.
type keyRecord struct {
	prefix string // of the keys, unique to a run of the floor
	// whole writes the record as onceflow writes it, one insert and one
	// update: with the principal's hash, the definition's fingerprint, the
	// recovery point, the state and the history entries onceflow's insert
	// and completion carry. Without it, the least record: the request and
	// its hash, an owner and a lease, then the response.
	whole bool
}

const (
	keyRecordInsert = `INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, request, owner, locked_until)
		VALUES ('floor', $1, gen_random_uuid(), 'floor', $2, $3::json, gen_random_uuid(), now() + interval '30 seconds')`
	keyRecordComplete = `UPDATE onceflow_keys SET status = 'completed', locked_until = NULL, response_status = 200,
		response_body = $2, updated_at = clock_timestamp(), completed_at = clock_timestamp()
		WHERE tenant_id = 'floor' AND key = $1`

	// wholeRecordInsert and wholeRecordComplete are the insert and the
	// completion onceflow makes (recovery's insertSQL and finishSQL), with
	// literals where the bench's records all hold the same.
	wholeRecordInsert = `INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, request, owner, principal_hash,
		definition, created_at, history, recovery_point, state, locked_until)
		VALUES ('floor', $1, gen_random_uuid(), 'floor', $2, $3::json, $4, sha256('floor'::bytea),
		$5, clock_timestamp(), onceflow_history(onceflow_history(NULL, 'claimed', $4), 'phase_committed', $4, 'first'),
		'first', $6::json, clock_timestamp() + interval '30 seconds')`
	wholeRecordComplete = `UPDATE onceflow_keys SET status = 'completed', locked_until = NULL, not_before = NULL,
		response_status = 201, response_body = $2, response_header = '{"Content-Type":["application/json"]}'::jsonb,
		recovery_point = 'last', state = $3::json, history = onceflow_history(history, 'completed', owner, 'last'),
		completed_at = clock_timestamp(), updated_at = clock_timestamp()
		WHERE tenant_id = 'floor' AND key = $1`
)

// definitionFingerprint stands for a workflow definition's fingerprint: a
// SHA-256 in hex, as onceflow stores it.
var definitionFingerprint = fmt.Sprintf("%x", sha256.Sum256([]byte("floor")))

func (k *keyRecord) key(i int64) string { return fmt.Sprintf("%s%d", k.prefix, i) }

// insert inserts the in-flight record of request; state is the workflow's
// state after the first transaction, which the whole record keeps.
func (k *keyRecord) insert(ctx context.Context, tx pgx.Tx, i int64, request, state []byte) error {
	if k == nil {
		return nil
	}
	hash := sha256.Sum256(request)
	if k.whole {
		_, err := tx.Exec(ctx, wholeRecordInsert, k.key(i), hash[:], string(request), ownerOf(i), definitionFingerprint, string(state))
		return err
	}
	_, err := tx.Exec(ctx, keyRecordInsert, k.key(i), hash[:], string(request))
	return err
}

// complete completes the record with response, which is also the final
// state.
func (k *keyRecord) complete(ctx context.Context, tx pgx.Tx, i int64, response []byte) error {
	if k == nil {
		return nil
	}
	if k.whole {
		_, err := tx.Exec(ctx, wholeRecordComplete, k.key(i), response, string(response))
		return err
	}
	_, err := tx.Exec(ctx, keyRecordComplete, k.key(i), response)
	return err
}

// ownerOf is an owner token, as onceflow's claim makes one.
func ownerOf(i int64) string { return fmt.Sprintf("00000000-0000-4000-8000-%012x", i) }
