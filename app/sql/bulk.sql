-- name: jobs_bulk_candidates
-- The next batch of jobs a bulk cancel or retry acts on: those in one of the statuses the
-- action allows (from the state machine) that match the filter, in id order after the last
-- batch's last id (keyset: every batch is a short transaction of its own). A tag filter is
-- the jobs list's: containment on the row.
SELECT j.id, j.workflow_id FROM jobs j
 WHERE j.status = ANY(%(statuses)s::text[])
   AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
   AND (%(task)s::text IS NULL OR j.task = %(task)s)
   AND j.tags @> %(tags)s::jsonb
   AND (%(after)s::uuid IS NULL OR j.id > %(after)s::uuid)
 ORDER BY j.id
 LIMIT %(limit)s

-- name: jobs_bulk_count
-- How many jobs a bulk action would act on now (a dry run: what a confirmation names).
SELECT count(*) AS count FROM jobs j
 WHERE j.status = ANY(%(statuses)s::text[])
   AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
   AND (%(task)s::text IS NULL OR j.task = %(task)s)
   AND j.tags @> %(tags)s::jsonb
