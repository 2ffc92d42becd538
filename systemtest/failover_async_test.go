package systemtest

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/internal/faults"
)

// failoverLostMin is how many checkouts the asynchronous failover waits
// to see acknowledged on the primary alone before it kills it.
const failoverLostMin = 5

// TestFailoverAsync: TestFailoverUnderLoad's service with the standby
// asynchronous, once with each source of downstream keys
// (--derive-keys-from). To make the loss certain rather than luck, the
// primary's WAL senders are stopped before the kill, until the clients got
// answers to checkouts started after that: acknowledged commits that exist
// on the primary alone. The monitor promotes the standby without them.
//
// What must hold in both modes: every checkout started after the pause and
// acknowledged before the kill is lost (a retry runs it again, not
// replayed); only checkouts sent before the kill are lost; every key ends completed, with one
// paid order, the answer's. With keys derived from the client's key, no
// key is charged twice: the lost record's charge goes out with its old key
// and the provider answers with the first charge. With keys derived from
// the record, every lost acknowledged record is charged twice, and every
// key charged twice lost a record in the failover: acknowledged, or in
// flight at the kill. Each mode logs its figures in one line.
func TestFailoverAsync(t *testing.T) {
	for _, source := range []foreign.KeySource{foreign.FromRecord, foreign.FromClientKey} {
		t.Run(source.String(), func(t *testing.T) { failoverAsync(t, source) })
	}
}

func failoverAsync(t *testing.T, source foreign.KeySource) {
	rnd := faults.Rand(t)
	r := newFailoverRun(t, rnd, "--derive-keys-from", source.String())
	require.NoError(t, r.f.SetAsync(r.ctx, failoverBound))
	r.awaitAnswers(int64(20 + rnd.IntN(40)))
	witness := r.holdCharge()
	// The witness's record, in flight, is on the standby; nothing after
	// the pause will be.
	require.NoError(t, r.f.WaitReplicated(r.ctx, failoverBound))
	resume, err := r.f.PauseReplication(r.ctx)
	require.NoError(t, err)
	defer resume()
	r.paused.Store(true)
	dbfaultPoll(t, time.Minute, 5*time.Millisecond, "answers to checkouts started after the pause", func() bool {
		return r.pausedAck.Load() >= failoverLostMin
	})
	seen := r.failover(witness)
	r.awaitAnswers(30)
	r.stop()
	for _, app := range r.apps {
		dbfaultAlive(t, app)
	}
	lost := failoverVerifyAsync(t, r, source, seen)
	t.Logf("%s: %d keys; %d acknowledged answers lost: %d records lost whole and made again (%d of them started after "+
		"the pause), %d lost their completion only and were resumed; %d keys charged twice (%d of them for a lost "+
		"acknowledged record); %s", source, len(r.keys), lost.acked, lost.remade, lost.paused, lost.acked-lost.remade,
		lost.doubled, lost.doubledAcked, seen)
}

// failoverLost counts what an asynchronous failover lost.
type failoverLost struct {
	// acked counts the acknowledged answers a retry did not replay: the
	// record was lost (remade), or its completion was (resumed again).
	acked int
	// remade counts the records lost whole and made again by the retry;
	// paused, those of them started after the pause.
	remade, paused int
	// doubled counts the keys charged twice; doubledAcked, those whose
	// lost record had been acknowledged.
	doubled, doubledAcked int
}

// failoverVerifyAsync checks every key of r after an asynchronous failover,
// sending each once more, and counts what was lost. A key answered before
// the kill began was committed on the old primary; one sent after the
// node was gone cannot have been.
func failoverVerifyAsync(t *testing.T, r *failoverRun, source foreign.KeySource, seen failoverSeen) failoverLost {
	t.Helper()
	again := make([]answer, len(r.keys))
	for i, k := range r.keys {
		require.NotNil(t, k.first, "key %s has a final answer", k.id)
		require.Equal(t, http.StatusCreated, k.first.status, "key %s: %s", k.id, k.first.body)
		a, err := r.d.post(r.ctx, r.apps[0].URL, k.id, k.body)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, a.status, "key %s: %s", k.id, a.body)
		again[i] = a
	}
	orders, charges := failoverStorage(t, r)

	var lost failoverLost
	for i, k := range r.keys {
		acked, now := failoverPaid(t, k.first), failoverPaid(t, &again[i])
		remade := again[i].replayed != "true"
		ackedBeforeKill := k.ackAt.Before(seen.killing)
		if remade || string(k.first.body) != string(again[i].body) {
			lost.acked++
			require.True(t, k.startAt.Before(seen.killedAt), "key %s: only what was sent before the kill can be lost", k.id)
		}
		if remade {
			lost.remade++
		}
		if k.afterPause && ackedBeforeKill {
			require.True(t, remade, "key %s: acknowledged while the primary kept its WAL, its record died with the primary", k.id)
			lost.paused++
		}
		require.Equal(t, []failoverOrder{{now.OrderID, "paid", now.ChargeID}}, orders["cus_"+k.id], "key %s: one paid order, the answer's", k.id)
		require.Contains(t, charges[k.amount], now.ChargeID, "key %s: the answer names its charge", k.id)
		n := len(charges[k.amount])
		switch source {
		case foreign.FromClientKey:
			require.Equal(t, 1, n, "key %s: with keys from the client's key, never charged twice", k.id)
			require.Equal(t, acked.ChargeID, now.ChargeID, "key %s: a lost record's charge is answered with the first", k.id)
		case foreign.FromRecord:
			require.LessOrEqual(t, n, 2, "key %s: one failover, at most one lost record", k.id)
			if remade {
				require.Equal(t, 2, n, "key %s: the remade record charged again, under its new id's key", k.id)
			}
		}
		if n == 2 {
			lost.doubled++
			if remade {
				lost.doubledAcked++
			}
			require.True(t, remade || !ackedBeforeKill,
				"key %s: charged twice, so a record of it was lost: acknowledged, or in flight at the kill", k.id)
		}
	}
	require.GreaterOrEqual(t, lost.paused, failoverLostMin, "the failover lost what only the primary had")
	require.Len(t, orders, len(r.keys), "orders for these keys' customers only")
	require.Len(t, charges, len(r.keys), "charges for these keys' amounts only")
	return lost
}

// failoverOrder is a checkout order as the database has it.
type failoverOrder struct{ id, status, chargeID string }

// failoverStorage returns the orders, by customer, and the provider's
// charges' ids, by amount.
func failoverStorage(t *testing.T, r *failoverRun) (map[string][]failoverOrder, map[int64][]string) {
	t.Helper()
	conn := dbfaultConnect(t, r.f.URL())
	orders := map[string][]failoverOrder{}
	rows, err := conn.Query(r.ctx, `SELECT customer_id, id, status, coalesce(charge_id, '') FROM checkout_orders`)
	require.NoError(t, err)
	var customer string
	var o failoverOrder
	_, err = pgx.ForEachRow(rows, []any{&customer, &o.id, &o.status, &o.chargeID}, func() error {
		orders[customer] = append(orders[customer], o)
		return nil
	})
	require.NoError(t, err)
	charges := map[int64][]string{}
	for _, c := range r.e.charges() {
		charges[c.AmountCents] = append(charges[c.AmountCents], c.ID)
	}
	return orders, charges
}

// failoverPaid is a checkout's 201 body: its order and its charge.
type failoverPaidBody struct {
	OrderID  string `json:"order_id"`
	ChargeID string `json:"charge_id"`
}

func failoverPaid(t *testing.T, a *answer) failoverPaidBody {
	t.Helper()
	var p failoverPaidBody
	require.NoError(t, json.Unmarshal(a.body, &p), "%s", a.body)
	return p
}
