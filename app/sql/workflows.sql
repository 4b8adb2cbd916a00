-- name: workflow_lock
-- Workflows are always locked before their step jobs, in id order: the one
-- lock order that keeps completions, cancels and timers from deadlocking, and
-- that makes two steps finishing at once unblock their dependent exactly once
-- (the second waits here, then its next statement sees the first's commit).
SELECT id, status, version FROM workflows WHERE id = ANY(%(ids)s::uuid[]) ORDER BY id FOR UPDATE

-- name: workflow_lock_unless_busy
-- A sub-workflow that ended locks its parent to end the parent's step, but
-- never waits for it: it holds its own lock, and locks go parent first (the
-- monitor finishes the step later: workflow_children_done).
SELECT id, status, version FROM workflows WHERE id = ANY(%(ids)s::uuid[]) ORDER BY id FOR UPDATE SKIP LOCKED

-- name: workflow_children_done
-- Sub-workflows that ended while their parent's step still waits for them.
SELECT c.* FROM workflows c JOIN jobs j ON j.id = c.parent_job_id
 WHERE c.parent_job_id IS NOT NULL AND c.status <> 'running' AND j.status = 'waiting'
 ORDER BY c.finished_at
 LIMIT %(limit)s

-- name: workflow_running_children
SELECT id FROM workflows WHERE parent_workflow_id = %(id)s AND status = 'running' ORDER BY id

-- name: workflow_children
SELECT id, parent_job_id, status FROM workflows WHERE parent_workflow_id = %(id)s ORDER BY created_at, id

-- name: workflow_submit
-- The WorkflowSubmitted event; a repeated idempotency_key conflicts in
-- idempotency_keys (see job_enqueue), nothing is appended and the caller
-- returns the existing workflow.
WITH input AS (
    SELECT %(id)s::uuid AS id, %(data)s::jsonb AS data, nullif(%(tags)s::jsonb, '{}') AS tags,
           coalesce(%(now)s::timestamptz, now()) AS at
), keyed AS (
    INSERT INTO idempotency_keys (stream_type, key, stream_id)
    SELECT 'workflow', i.data ->> 'idempotency_key', i.id FROM input i WHERE i.data ? 'idempotency_key'
    ON CONFLICT DO NOTHING
    RETURNING stream_id
)
INSERT INTO events (stream_type, stream_id, version, type, data, tags, workflow_id, occurred_at, actor,
                    hash)
SELECT 'workflow', i.id, 1, 'WorkflowSubmitted', i.data, i.tags, i.id, i.at, %(actor)s,
       event_hash(NULL, 'workflow', i.id, 1, 'WorkflowSubmitted', 1::smallint, i.data, i.tags, i.id, i.at,
                  %(actor)s)
  FROM input i
 WHERE NOT i.data ? 'idempotency_key' OR i.id IN (SELECT stream_id FROM keyed)
RETURNING stream_id

-- name: workflow_by_idempotency_key
SELECT stream_id FROM idempotency_keys WHERE stream_type = 'workflow' AND key = %(key)s

-- name: workflow_by_external_id
SELECT id FROM workflows WHERE external_id = %(external_id)s

-- name: workflow_get
SELECT * FROM workflows WHERE id = %(id)s

-- name: workflow_steps
SELECT * FROM jobs WHERE workflow_id = %(id)s ORDER BY created_at, step

-- name: workflow_due_deadlines
-- Running workflows past their deadline (the partial index workflows_deadline
-- holds just the running ones that have a deadline), earliest first.
SELECT id FROM workflows
 WHERE status = 'running' AND deadline_at IS NOT NULL
   AND deadline_at <= coalesce(%(now)s::timestamptz, now())
 ORDER BY deadline_at
 LIMIT %(limit)s

-- name: workflow_step_rows
-- A workflow's steps without the elements of its fan-out steps: what the DAG
-- rules read each time a step ends (a fan-out's elements are summed up by
-- fanout_summary instead of read one by one).
SELECT * FROM jobs WHERE workflow_id = %(id)s AND element_of IS NULL ORDER BY created_at, step

-- name: workflow_get_many
-- The rows of the workflows a batch of reports advances, read with their steps
-- (workflow_step_rows_many) in the round trip of the reports (rows.load_many).
SELECT * FROM workflows WHERE id = ANY(%(ids)s::uuid[])

-- name: workflow_step_rows_many
-- workflow_step_rows of several workflows at once, each workflow's in its order.
SELECT * FROM jobs WHERE workflow_id = ANY(%(ids)s::uuid[]) AND element_of IS NULL
 ORDER BY workflow_id, created_at, step

-- name: fanout_summary
SELECT count(*) AS total,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE status IN ('pending', 'running')) AS active,
       count(*) FILTER (WHERE status IN ('dead', 'cancelled')) AS died,
       count(*) FILTER (WHERE status = 'blocked') AS blocked
  FROM jobs WHERE workflow_id = %(workflow_id)s AND element_of = %(step)s

-- name: fanout_elements
-- Elements of a fan-out step in some statuses, by index (at most limit).
SELECT * FROM jobs
 WHERE workflow_id = %(workflow_id)s AND element_of = %(step)s AND status = ANY(%(statuses)s::text[])
 ORDER BY element_index
 LIMIT %(limit)s

-- name: workflow_tree_job_count
-- How many jobs a workflow's whole tree has (its root's steps and fan-out elements, and those of
-- every sub-workflow below the root, by workflows_parent): QFORGE_MAX_WORKFLOW_JOBS. Asked on
-- every step a code workflow schedules. The arrays keep both lookups on their indexes whatever
-- the statistics say (a join here was planned as a scan of all jobs: a cost that grew with the
-- table, per step).
WITH RECURSIVE up AS (
    SELECT id, parent_workflow_id, 0 AS depth FROM workflows WHERE id = %(id)s
    UNION ALL
    SELECT w.id, w.parent_workflow_id, up.depth + 1 FROM workflows w JOIN up ON w.id = up.parent_workflow_id
     WHERE up.depth < 100
), down AS (
    SELECT id FROM up WHERE parent_workflow_id IS NULL
    UNION ALL
    SELECT unnest(ARRAY(SELECT w.id FROM workflows w WHERE w.parent_workflow_id = down.id)) FROM down
)
SELECT count(*) AS count FROM jobs WHERE workflow_id = ANY(ARRAY(SELECT id FROM down))
