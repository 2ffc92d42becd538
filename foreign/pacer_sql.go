package foreign

// The Pacer's statements, each a transaction of its own (see migration
// 0013). Times are the database clock's.

// reserveSQL takes a token of a bucket ($3 rate per second, $4 burst) for
// the downstream $1 and scope $2, in one statement: it refills the bucket
// from the time elapsed, and takes a token when the circuit is closed and
// the token is due within $5 seconds, even a token not yet there (the
// bucket goes below zero), which the caller sleeps until it is due. It
// returns (true, the wait until the token is due, false), or, when it took
// nothing, (false, the wait until the circuit closes or the token would be
// due, whether the circuit is open). A new bucket starts full.
const reserveSQL = `
WITH clock AS (SELECT clock_timestamp() AS now),
taken AS (
    INSERT INTO {schema}.onceflow_pace AS p (downstream, scope, tokens, refilled_at)
    SELECT $1, $2, $4::float8 - 1, now FROM clock
    ON CONFLICT (downstream, scope) DO UPDATE SET
        tokens = least($4::float8, p.tokens + $3::float8 * extract(epoch FROM excluded.refilled_at - p.refilled_at)::float8) - 1,
        refilled_at = excluded.refilled_at
    WHERE p.open_until <= excluded.refilled_at
      AND 1 - least($4::float8, p.tokens + $3::float8 * extract(epoch FROM excluded.refilled_at - p.refilled_at)::float8)
          <= $5::float8 * $3::float8
    RETURNING greatest(0, -p.tokens / $3::float8) AS wait)
SELECT true, wait, false FROM taken
UNION ALL
SELECT false,
       CASE WHEN p.open_until > clock.now THEN extract(epoch FROM p.open_until - clock.now)::float8
            ELSE (1 - least($4::float8, p.tokens + $3::float8 * extract(epoch FROM clock.now - p.refilled_at)::float8)) / $3::float8
       END,
       p.open_until > clock.now
FROM {schema}.onceflow_pace p, clock
WHERE p.downstream = $1 AND p.scope = $2 AND NOT EXISTS (SELECT FROM taken)`

// openSQL opens the circuit of downstream $1, scope $2, for $3
// microseconds, unless it is open longer already.
const openSQL = `
UPDATE {schema}.onceflow_pace
SET open_until = greatest(open_until, clock_timestamp() + $3 * interval '1 microsecond')
WHERE downstream = $1 AND scope = $2`

// claimSlotSQL claims the lowest free slot below the limit $3 of
// downstream $1, scope $2, for holder $4 and $5 microseconds. Slots at or
// above the limit (left by a higher one) are never claimed.
const claimSlotSQL = `
UPDATE {schema}.onceflow_pace_slots
SET holder = $4, held_until = clock_timestamp() + $5 * interval '1 microsecond'
WHERE (downstream, scope, slot) = (
    SELECT downstream, scope, slot FROM {schema}.onceflow_pace_slots
    WHERE downstream = $1 AND scope = $2 AND slot < $3 AND held_until < clock_timestamp()
    ORDER BY slot LIMIT 1
    FOR UPDATE SKIP LOCKED)
RETURNING slot`

// makeSlotsSQL makes the slots 0 to $3-1 of downstream $1, scope $2, that
// are missing.
const makeSlotsSQL = `
INSERT INTO {schema}.onceflow_pace_slots (downstream, scope, slot)
SELECT $1, $2, s FROM generate_series(0, $3::int - 1) AS s
ON CONFLICT DO NOTHING`

// renewSlotSQL extends holder $3's slot by $4 microseconds from now.
const renewSlotSQL = `
UPDATE {schema}.onceflow_pace_slots
SET held_until = clock_timestamp() + $4 * interval '1 microsecond'
WHERE downstream = $1 AND scope = $2 AND holder = $3`

// releaseSlotSQL frees holder $3's slot.
const releaseSlotSQL = `
UPDATE {schema}.onceflow_pace_slots SET holder = NULL, held_until = '-infinity'
WHERE downstream = $1 AND scope = $2 AND holder = $3`
