-- name: queue_settings_lock
-- A queue's settings row, locked; the advisory lock first serialises the very
-- first configuration of a queue (no row to lock yet).
SELECT pg_advisory_xact_lock(hashtextextended('qforge-queue:' || %(queue)s, 0)),
       (SELECT row_to_json(s) FROM queue_settings s WHERE s.queue = %(queue)s FOR UPDATE) AS row

-- name: queue_bucket_set
-- A rate limit set or changed: the bucket starts full (a new limit applies at
-- once; what was spent before does not carry over).
INSERT INTO queue_buckets (queue, tokens, refilled_at)
VALUES (%(queue)s, %(burst)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (queue) DO UPDATE SET tokens = excluded.tokens, refilled_at = excluded.refilled_at

-- name: queue_bucket_drop
DELETE FROM queue_buckets WHERE queue = %(queue)s

-- name: queue_settings_list
SELECT queue, paused, rate_per_second, burst, updated_at FROM queue_settings ORDER BY queue

-- name: schedule_lock
SELECT * FROM schedules WHERE name = %(name)s FOR UPDATE

-- name: schedule_get
SELECT * FROM schedules WHERE name = %(name)s

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
