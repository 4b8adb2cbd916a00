-- Counters of jobs by queue and status: a projection of jobs, kept by the
-- statement that changes jobs (the fold, an archive's clean-up, a replay's
-- swap), from the rows it changed. Every statement inserts its own deltas
-- (no row another writer needs, so no waiting and no deadlock);
-- queue_counts_compact() folds them into queue_counts.

CREATE OR REPLACE FUNCTION jobs_counted_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queue_count_deltas (queue, status, n)
    SELECT queue, status, count(*) FROM new_jobs GROUP BY queue, status;
    -- Wake idle workers of the queues that just got claimable work (34_wake.sql): one
    -- per queue when some of it is due now; all, with when, if the earliest is due later,
    -- so that they set a timer on it instead of finding it at their next poll.
    -- A few plain jobs due now are handed to idle workers instead (jobs_arrive, 34_wake.sql).
    PERFORM jobs_arrive(queue, min(run_at), count(*),
                        coalesce(array_agg(id ORDER BY priority DESC, run_at, id)
                                     FILTER (WHERE run_at <= now() AND workflow_id IS NULL
                                               AND concurrency_key IS NULL AND fairness_key IS NULL), '{}'))
       FROM new_jobs WHERE status = 'pending' GROUP BY queue;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION jobs_counted_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    woken bigint;
BEGIN
    WITH changed AS (
        SELECT queue, status, sum(n) AS n, min(run_at) AS due
          FROM (SELECT queue, status, -1 AS n, NULL::timestamptz AS run_at FROM old_jobs
                UNION ALL
                SELECT queue, status, 1, run_at FROM new_jobs) x
         GROUP BY queue, status
        HAVING sum(n) <> 0
    ), written AS (
        INSERT INTO queue_count_deltas (queue, status, n) SELECT queue, status, n FROM changed
    )
    -- as jobs_counted_insert: a retry due later names when (the earliest of the statement's)
    SELECT count(jobs_wake(queue, due, n)) INTO woken FROM changed WHERE status = 'pending' AND n > 0;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION jobs_counted_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queue_count_deltas (queue, status, n)
    SELECT queue, status, -count(*) FROM old_jobs GROUP BY queue, status;
    RETURN NULL;
END $$;

SELECT jobs_kept_by('jobs_counted');

-- Fold the deltas into queue_counts (the monitor's leader, every tick). Rows
-- of transactions still running are not seen and stay for the next time.
CREATE OR REPLACE FUNCTION queue_counts_compact() RETURNS bigint LANGUAGE sql AS $$
    WITH moved AS (
        DELETE FROM queue_count_deltas RETURNING queue, status, n
    ), summed AS (
        SELECT queue, status, sum(n) AS n, count(*) AS rows FROM moved GROUP BY queue, status
    ), added AS (
        INSERT INTO queue_counts AS c (queue, status, n)
        SELECT queue, status, n FROM summed ORDER BY queue, status
        ON CONFLICT (queue, status) DO UPDATE SET n = c.n + excluded.n
    )
    SELECT coalesce(sum(rows), 0)::bigint FROM summed
$$;
