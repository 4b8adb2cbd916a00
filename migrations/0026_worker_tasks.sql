-- The tasks each worker can run (issue 29): GET /queues and a job's page say when no
-- live worker registers a pending job's task. NULL: a worker of an older release,
-- which did not say (it is then assumed to run anything).
ALTER TABLE workers ADD COLUMN tasks text[];
