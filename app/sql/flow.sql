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
