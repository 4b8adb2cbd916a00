-- Read-side queries of the API (app/projections/*): lists, search, statistics.
-- Keyset pagination everywhere: a list page is an index range that starts
-- after the last row of the previous one, never an OFFSET.

-- name: jobs_list
-- Newest first (after_created is carried in the cursor but not needed here). A tag filter starts from execution_tags (an index range on
-- (key, value)) and checks the remaining tags on the row; no scan of jobs.
SELECT j.* FROM jobs j
 WHERE (%(status)s::text IS NULL OR j.status = %(status)s)
   AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
   AND (%(task)s::text IS NULL OR j.task = %(task)s)
   AND (%(tag_key)s::text IS NULL OR (
            j.id IN (SELECT t.id FROM execution_tags t
                      WHERE t.key = %(tag_key)s AND t.value = %(tag_value)s AND t.kind = 'job')
            AND j.tags @> %(tags)s::jsonb))
   AND (%(after_id)s::uuid IS NULL OR j.id < %(after_id)s::uuid)
 -- ids are time-ordered (UUIDv7), so the primary key walked backwards is
 -- newest first: no created_at index to maintain on every job transition.
 ORDER BY j.id DESC
 LIMIT %(limit)s

-- name: workflows_list
SELECT w.id, w.name, w.status, w.tags, w.error, w.created_at, w.updated_at, w.finished_at
  FROM workflows w
 WHERE (%(status)s::text IS NULL OR w.status = %(status)s)
   AND (%(name)s::text IS NULL OR w.name = %(name)s)
   AND (%(tag_key)s::text IS NULL OR (
            w.id IN (SELECT t.id FROM execution_tags t
                      WHERE t.key = %(tag_key)s AND t.value = %(tag_value)s
                        AND t.kind = 'workflow')
            AND w.tags @> %(tags)s::jsonb))
   AND (%(after_created)s::timestamptz IS NULL
        OR (w.created_at, w.id) < (%(after_created)s::timestamptz, %(after_id)s::uuid))
 ORDER BY w.created_at DESC, w.id DESC
 LIMIT %(limit)s

-- name: workflow_step_counts
-- How many steps of each listed workflow are in each status (for list pages), the
-- elements of fan-out steps apart (element), as the workflow's page counts them.
SELECT workflow_id, element_of IS NOT NULL AS element, status, count(*) AS n
  FROM jobs
 WHERE workflow_id = ANY(%(ids)s::uuid[])
 GROUP BY workflow_id, element_of IS NOT NULL, status

-- name: executions_tagged_all
-- A condition of both walks of executions_by_tags (where they say `-- include:
-- executions_tagged_all`): the execution t carries every wanted tag, a
-- primary-key probe of execution_tags each.
        AND NOT EXISTS (SELECT 1 FROM wanted x
                         WHERE NOT EXISTS (SELECT 1 FROM execution_tags o
                                            WHERE o.key = x.key AND o.value = x.value
                                              AND o.kind = t.kind AND o.id = t.id))

-- name: executions_by_tags
-- Everything that carries ALL the given tags, newest first, paged in the database: the
-- first tag's index range of execution_tags (primary key (key, value, kind, id)) is walked
-- backwards from the cursor, once for jobs and once for workflows (ids are UUIDv7, so id
-- order is creation order), and each id found is checked for the other tags (a primary-key
-- probe each) and the filters; each walk stops at the page's size. No step gathers every
-- match first, so a page costs about its size whatever the tags match in all.
-- With an actor, only executions that actor wrote an event for (its own, or one of a
-- workflow's steps, say a trigger).
WITH wanted AS (
    SELECT DISTINCT w.key, w.value
      FROM unnest(%(keys)s::text[], %(values)s::text[]) AS w(key, value)
), first_tag AS (
    SELECT key, value FROM wanted ORDER BY key, value LIMIT 1
), found AS (
    (SELECT 'job' AS kind, j.id, j.created_at
       FROM first_tag f
       JOIN execution_tags t ON t.key = f.key AND t.value = f.value AND t.kind = 'job'
       JOIN jobs j ON j.id = t.id
      WHERE %(wait_type)s::text IS NULL
        AND (%(after_id)s::uuid IS NULL OR t.id < %(after_id)s::uuid)
        -- include: executions_tagged_all
        AND (%(actor)s::text IS NULL
             OR EXISTS (SELECT 1 FROM log_stream(t.id) e WHERE e.actor = %(actor)s))
      ORDER BY t.id DESC
      LIMIT %(limit)s)
    UNION ALL
    (SELECT 'workflow', w.id, w.created_at
       FROM first_tag f
       JOIN execution_tags t ON t.key = f.key AND t.value = f.value AND t.kind = 'workflow'
       JOIN workflows w ON w.id = t.id
      WHERE (%(after_id)s::uuid IS NULL OR t.id < %(after_id)s::uuid)
        -- include: executions_tagged_all
        AND (%(actor)s::text IS NULL
             OR EXISTS (SELECT 1 FROM log_stream(t.id) e WHERE e.actor = %(actor)s)
             OR EXISTS (SELECT 1 FROM log_workflow(t.id) e WHERE e.actor = %(actor)s))
        -- ?waiting=trigger|timer: running workflows that wait on such a step and on
        -- nothing else (no step due, running, or waiting for a fan-out or a child);
        -- the same rule as waiting_on in GET /workflows/{id}
        AND (%(wait_type)s::text IS NULL
             OR (w.status = 'running'
                 AND EXISTS (SELECT 1 FROM jobs s WHERE s.workflow_id = w.id AND s.status = 'waiting'
                                AND s.step_type = %(wait_type)s::text)
                 AND NOT EXISTS (SELECT 1 FROM jobs s WHERE s.workflow_id = w.id
                                    AND (s.status IN ('pending', 'running')
                                         OR (s.status = 'waiting'
                                             AND s.step_type IS DISTINCT FROM 'wait_for_trigger'
                                             AND s.step_type IS DISTINCT FROM 'sleep')))))
      ORDER BY t.id DESC
      LIMIT %(limit)s)
)
SELECT kind, id, created_at FROM found
 ORDER BY id DESC
 LIMIT %(limit)s

-- name: jobs_by_ids
SELECT * FROM jobs WHERE id = ANY(%(ids)s::uuid[])

-- name: workflows_by_ids
SELECT w.id, w.name, w.status, w.tags, w.error, w.created_at, w.updated_at, w.finished_at
  FROM workflows w WHERE id = ANY(%(ids)s::uuid[])

-- name: log_positions_left
-- How many more positions the attached partitions hold beyond the next append's.
SELECT (SELECT coalesce(max(upper), 1) FROM log_partitions()) - log_next_position() AS left

-- name: queues_stats
-- Counts by queue and status from the counter projection (queue_counts plus
-- the deltas the monitor has not folded in yet: one consistent snapshot of
-- both is exact), not a scan of jobs. The oldest due pending job of a queue:
-- queue_oldest_due(), a few index probes whatever the backlog.
WITH counts AS (
    SELECT queue, status, sum(n)::bigint AS n
      FROM (SELECT queue, status, n FROM queue_counts
            UNION ALL
            SELECT queue, status, n FROM queue_count_deltas) c
     GROUP BY queue, status
    HAVING sum(n) <> 0
)
SELECT c.queue, c.status, c.n,
       CASE WHEN c.status = 'pending'
            THEN extract(epoch FROM (now() - queue_oldest_due(c.queue)))::float8
       END AS oldest_due_seconds
  FROM counts c
 ORDER BY c.queue, c.status

-- name: events_counts_after
-- What happened in the log since a gapless cursor, for the metrics counters:
-- events by type, and the claim latency (Claimed minus the moment the job
-- became claimable: the run_at of the event that made it pending) bucketed
-- with the given upper bounds. Same visibility rule as events_after.
WITH visible AS (
    SELECT e.xid, e.position, e.type, e.stream_id, e.version, e.occurred_at
      FROM events_after_page(%(after_xid)s::xid8, %(after_position)s::bigint, %(limit)s) e
), latency AS (
    SELECT greatest(extract(epoch FROM v.occurred_at - ready.at), 0)::float8 AS seconds
      FROM visible v
     CROSS JOIN LATERAL (SELECT job_ready_at(v.stream_id, v.version, %(ready_types)s::text[]) AS at) ready
     WHERE v.type = 'Claimed'
)
SELECT (SELECT jsonb_object_agg(type, n)
          FROM (SELECT type, count(*) AS n FROM visible GROUP BY type) c) AS counts,
       (SELECT array_agg((SELECT count(*) FROM latency l WHERE l.seconds <= b) ORDER BY ord)
          FROM unnest(%(bounds)s::float8[]) WITH ORDINALITY AS u(b, ord)) AS buckets,
       (SELECT count(*) FROM latency) AS claims,
       (SELECT coalesce(sum(seconds), 0) FROM latency) AS latency_sum,
       (SELECT count(*) FROM visible) AS read,
       (SELECT xid::text FROM visible ORDER BY xid DESC, position DESC LIMIT 1) AS last_xid,
       (SELECT position FROM visible ORDER BY xid DESC, position DESC LIMIT 1) AS last_position

-- name: database_ping
SELECT 1
