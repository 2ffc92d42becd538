package bench

import (
	"context"
	"crypto/sha256"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// keyRecord writes, by hand, the least a key record costs: one insert of an
// in-flight record with its request in a workflow's first transaction, and
// one update that completes it with its response in the last. A floor that
// writes it measures the bound on what onceflow may add to the floor's WAL.
// A nil *keyRecord writes nothing.
type keyRecord struct {
	prefix string // of the keys, unique to a run of the floor
}

const (
	keyRecordInsert = `INSERT INTO onceflow_keys (tenant_id, key, id, workflow, request_hash, request, owner, locked_until)
		VALUES ('floor', $1, gen_random_uuid(), 'floor', $2, $3::json, gen_random_uuid(), now() + interval '30 seconds')`
	keyRecordComplete = `UPDATE onceflow_keys SET status = 'completed', locked_until = NULL, response_status = 200,
		response_body = $2, updated_at = clock_timestamp(), completed_at = clock_timestamp()
		WHERE tenant_id = 'floor' AND key = $1`
)

func (k *keyRecord) key(i int64) string { return fmt.Sprintf("%s%d", k.prefix, i) }

func (k *keyRecord) insert(ctx context.Context, tx pgx.Tx, i int64, request []byte) error {
	if k == nil {
		return nil
	}
	hash := sha256.Sum256(request)
	_, err := tx.Exec(ctx, keyRecordInsert, k.key(i), hash[:], string(request))
	return err
}

func (k *keyRecord) complete(ctx context.Context, tx pgx.Tx, i int64, response []byte) error {
	if k == nil {
		return nil
	}
	_, err := tx.Exec(ctx, keyRecordComplete, k.key(i), response)
	return err
}
