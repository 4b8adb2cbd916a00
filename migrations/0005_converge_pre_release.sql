-- Databases made by development builds before 0.1.0 may still hold indexes that
-- 0002 no longer creates (the planner picked jobs_queue_status for the claim;
-- jobs_created was replaced by the time-ordered id), and those that applied
-- 0004 under its old name lack the dead-letter index. A 0.1.0 or a fresh
-- database has none of the first two and all of the third: nothing changes.
DROP INDEX IF EXISTS jobs_queue_status;
DROP INDEX IF EXISTS jobs_created;
CREATE INDEX IF NOT EXISTS jobs_dead ON jobs (id) WHERE status = 'dead';
