-- name: worker_record
-- A worker's own row, written on start and on every heartbeat tick. One upsert
-- for both, so a row removed by hand (or a worker marked gone that was only
-- slow) comes back on the next tick.
INSERT INTO workers (name, host, pid, queues, concurrency, running, status, started_at,
                     last_seen, stopped_at, tasks)
VALUES (%(name)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s, %(running)s::jsonb,
        'running', %(started_at)s, now(), NULL, %(tasks)s)
ON CONFLICT (name) DO UPDATE
   SET host = excluded.host, pid = excluded.pid, queues = excluded.queues, tasks = excluded.tasks,
       concurrency = excluded.concurrency, running = excluded.running,
       status = 'running', started_at = excluded.started_at,
       last_seen = excluded.last_seen, stopped_at = NULL

-- name: worker_stop
-- A clean shutdown: the worker leaves the live list at once.
UPDATE workers
   SET status = 'stopped', running = '[]', last_seen = now(), stopped_at = now()
 WHERE name = %(name)s

-- name: workers_mark_gone
-- The monitor's sweep: workers silent for longer than the stale limit. Their
-- jobs are recovered separately, by heartbeat age (job_stale).
UPDATE workers
   SET status = 'gone', stopped_at = now()
 WHERE status = 'running'
   AND last_seen < now() - make_interval(secs => %(stale_seconds)s)
RETURNING name

-- name: workers_live
-- Live means heartbeating recently, whether or not the monitor swept yet.
SELECT name, host, pid, queues, concurrency, running, last_seen, started_at, tasks
  FROM workers
 WHERE status = 'running'
   AND last_seen >= now() - make_interval(secs => %(stale_seconds)s)
 ORDER BY name

-- name: job_release
-- Fenced (job_current_attempt, in jobs.sql) batch hand-back by a stopping
-- worker: Released puts the current attempt's job back to pending without
-- using up an attempt (the fold counts it in free_attempts). A job that was
-- cancelled or re-claimed meanwhile matches no row and stays as it is.
WITH fence(event) AS (VALUES ('Released')), fenced AS (
    -- include: job_current_attempt
), target AS (
    SELECT f.*, jsonb_build_object('attempt', f.attempts, 'reason', %(reason)s::text) AS data
      FROM fenced f
)
-- include: job_report_append
RETURNING stream_id AS id

-- name: monitor_try_lead
-- Monitor leadership: a session advisory lock, held until the leader's
-- connection ends (so a dead leader frees it without anyone's help).
SELECT pg_try_advisory_lock(%(key)s)

-- name: monitor_try_lead_xact
-- The same lock for the length of the transaction: behind a transaction pooler
-- without a direct connection the leader keeps that transaction open
-- (qforge.workers.leadership says why that is safe).
SELECT pg_try_advisory_xact_lock(%(key)s)

-- name: monitor_still_leads
-- The leader's transaction is still there (behind a transaction pooler).
SELECT 1

-- name: counters_compact
-- Fold the counters' deltas into queue_counts (rows, see definitions/35_counters.sql).
SELECT queue_counts_compact() AS rows

-- name: concurrency_compact
-- One released row per concurrency key (definitions/65_flow.sql).
SELECT concurrency_compact() AS rows

-- name: log_maintain
-- Keep empty partitions ahead of the appends (definitions/50_log_partitions.sql).
SELECT log_maintain() AS made


-- name: queue_due_tasks
-- The tasks among the first due pending jobs of each queue (at most 200 a queue, in
-- claim order through jobs_claim: a few index pages whatever the backlog), for telling
-- which of them no live worker registers.
SELECT q.queue, h.task
  FROM unnest(%(queues)s::text[]) AS q(queue)
 CROSS JOIN LATERAL (SELECT DISTINCT head.task
                       FROM (SELECT j.task FROM jobs j
                              WHERE j.status = 'pending' AND j.queue = q.queue AND j.run_at <= now()
                              ORDER BY j.priority DESC, j.run_at
                              LIMIT 200) head) h
 ORDER BY q.queue, h.task

-- name: worker_wait
-- A worker whose claim came up short waits for work on its own channel (34_wake.sql):
-- the next statement that makes jobs of these queues due takes this row and wakes it alone,
-- or hands it a few new jobs, claimed for `worker` (jobs_hand), while backend `pid` (the
-- listening connection) lives.
INSERT INTO job_waiters (channel, queues, slots, worker, pid)
VALUES (%(channel)s, %(queues)s, %(slots)s, %(worker)s, %(pid)s)

-- name: job_handed
-- Jobs handed to this worker (jobs_hand) whose notification named only their ids (too long).
SELECT id, task, queue, payload, attempts AS attempt, timeout_seconds, workflow_id, step, tags, trace
  FROM jobs
 WHERE id = ANY(%(ids)s::uuid[]) AND status = 'running' AND worker = %(worker)s

-- name: worker_wait_end
-- The worker stops, or its listening connection (whose pid names the channel) is gone.
DELETE FROM job_waiters WHERE channel = %(channel)s
