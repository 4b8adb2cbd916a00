-- name: queue_settings_lock
-- A queue's settings row, locked; the advisory lock first serialises the very
-- first configuration of a queue (no row to lock yet).
SELECT pg_advisory_xact_lock(hashtextextended('qforge-queue:' || %(queue)s, 0)),
       (SELECT row_to_json(s) FROM queue_settings s WHERE s.queue = %(queue)s FOR UPDATE) AS row

-- name: queue_bucket_set
-- A rate limit set or changed: the bucket starts full (a new limit applies at
-- once; what was spent before does not carry over; the old shards are dropped
-- first). A bucket with room for several batches is split into shards (see
-- migration 0015): one per 100 tokens of burst, at most 4, so each shard still
-- holds a batch of 100 and up to 4 claimers spend at once.
INSERT INTO queue_buckets (queue, shard, share, tokens, refilled_at)
SELECT %(queue)s, s.shard, 1.0 / x.n, %(burst)s::float8 / x.n, coalesce(%(now)s::timestamptz, now())
  FROM (SELECT least(4, greatest(1, %(burst)s::integer / 100)) AS n) x
 CROSS JOIN LATERAL generate_series(0, x.n - 1) AS s(shard)

-- name: queue_bucket_drop
DELETE FROM queue_buckets WHERE queue = %(queue)s

-- name: queue_settings_list
SELECT queue, paused, rate_per_second, burst, updated_at FROM queue_settings ORDER BY queue

-- name: schedule_lock
SELECT * FROM schedules WHERE name = %(name)s FOR UPDATE

-- name: schedule_get
SELECT * FROM schedules WHERE name = %(name)s

-- name: schedule_created_trace
-- The trace context its creation stored (ScheduleCreated, the stream's first event), which the
-- trace of each fire links to; none once that event is archived.
SELECT data -> 'trace' AS trace FROM events WHERE stream_id = %(id)s AND version = 1

-- name: schedule_list
SELECT * FROM schedules ORDER BY name

-- name: schedule_due
-- Schedules whose next tick has come (the monitor fires them, each in its own
-- transaction under the schedule's row lock).
SELECT name FROM schedules
 WHERE NOT paused AND next_fire_at <= coalesce(%(now)s::timestamptz, now())
 ORDER BY next_fire_at
 LIMIT %(limit)s

-- name: schedule_next_due
SELECT min(next_fire_at) AS at FROM schedules WHERE NOT paused

-- name: queue_wake
-- Workers sleeping on an empty claim wake up on this channel (see 35_counters.sql).
SELECT pg_notify('qforge_jobs', %(queue)s)

-- name: key_settings_lock
-- A key's settings row, locked; the advisory lock first serialises the very
-- first configuration of a key (no row to lock yet).
SELECT pg_advisory_xact_lock(hashtextextended('qforge-key:' || %(key)s, 0)),
       (SELECT row_to_json(s) FROM key_settings s WHERE s.key = %(key)s FOR UPDATE) AS row

-- name: key_bucket_set
-- A key's rate limit set or changed: its bucket starts full (as a queue's).
INSERT INTO key_buckets (key, tokens, refilled_at)
VALUES (%(key)s, %(burst)s::float8, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (key) DO UPDATE SET tokens = excluded.tokens, refilled_at = excluded.refilled_at

-- name: key_bucket_drop
DELETE FROM key_buckets WHERE key = %(key)s

-- name: key_list
-- Every key anyone configured or any job used (as a concurrency key: its slot
-- row; as a fairness key: its rotation rows, or its running jobs), with what is
-- set and what runs. Keys come in name order, a page at a time after `after`.
WITH named AS (
    SELECT key FROM key_settings WHERE key > coalesce(%(after)s, '')
    UNION SELECT key FROM concurrency_slots WHERE key > coalesce(%(after)s, '')
    UNION SELECT key FROM fairness_turns WHERE key > coalesce(%(after)s, '')  -- '': jobs without a key
), page AS (
    SELECT key FROM named WHERE %(key)s::text IS NULL OR key = %(key)s ORDER BY key LIMIT %(limit)s
)
SELECT p.key, ks.key IS NOT NULL AS configured, ks.concurrency_limit, coalesce(ks.weight, 1) AS weight,
       ks.rate_per_second, ks.burst, ks.updated_at,
       coalesce(cr.lim, ks.concurrency_limit) AS concurrency_limit_in_force, cr.running AS concurrency_running,
       (SELECT count(*) FROM jobs j WHERE j.status = 'running' AND j.fairness_key = p.key) AS fairness_running,
       (SELECT sum(f.taken) FROM fairness_turns f WHERE f.key = p.key) AS fairness_claimed
  FROM page p
  LEFT JOIN key_settings ks ON ks.key = p.key
  LEFT JOIN concurrency_running cr ON cr.key = p.key
 ORDER BY p.key
