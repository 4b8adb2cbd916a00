-- Counters of jobs by queue and status: a projection of jobs, kept by the
-- statement that changes jobs (the fold, an archive's clean-up, a replay's
-- swap), from the rows it changed. Every statement inserts its own deltas
-- (no row another writer needs, so no waiting and no deadlock);
-- queue_counts_compact() folds them into queue_counts.
--
-- The same triggers keep the running jobs per concurrency key (see
-- concurrency_slots, migration 0010, and 65_flow.sql), first: a job that starts
-- running adds to its key's claimed (the claim holds the key's row already;
-- other writers lock rows in key order), one that stops running appends to
-- concurrency_releases (no lock on the key's row). A statement without keyed
-- jobs passes over that part after one look at its rows. (Once triggers of
-- their own, jobs_concurrency_*: each statement trigger costs every statement
-- on jobs a call, issue 33.)
DROP TRIGGER IF EXISTS jobs_concurrency_insert ON jobs;
DROP TRIGGER IF EXISTS jobs_concurrency_update ON jobs;
DROP TRIGGER IF EXISTS jobs_concurrency_delete ON jobs;
DROP FUNCTION IF EXISTS jobs_concurrency_insert();
DROP FUNCTION IF EXISTS jobs_concurrency_update();
DROP FUNCTION IF EXISTS jobs_concurrency_delete();

CREATE OR REPLACE FUNCTION jobs_counted_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_jobs WHERE concurrency_key IS NOT NULL) THEN
        -- A key's row comes with its first job; the latest job's limit is the key's.
        INSERT INTO concurrency_slots AS s (key, lim, claimed)
        SELECT concurrency_key, max(concurrency_limit), count(*) FILTER (WHERE status = 'running')
          FROM new_jobs WHERE concurrency_key IS NOT NULL
         GROUP BY concurrency_key ORDER BY concurrency_key
        ON CONFLICT (key) DO UPDATE SET lim = excluded.lim, claimed = s.claimed + excluded.claimed
         WHERE s.lim <> excluded.lim OR excluded.claimed <> 0;
    END IF;
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
    IF EXISTS (SELECT 1 FROM new_jobs WHERE concurrency_key IS NOT NULL) THEN
        -- Per key, running rows after less running rows before: no join of the two
        -- transition tables (which the planner, knowing nothing of them, ran as a
        -- nested loop over every pair: 40 % of a keyed claim's CPU). A row that
        -- stays running (a heartbeat) adds and takes one; a key that gained
        -- running jobs counts them as claimed, one that lost some appends them as
        -- released (a statement does either for a key, or both cancel out).
        WITH moved AS (
            SELECT x.key, sum(x.d) AS net
              FROM (SELECT n.concurrency_key AS key, 1 AS d FROM new_jobs n
                     WHERE n.concurrency_key IS NOT NULL AND n.status = 'running'
                    UNION ALL
                    SELECT o.concurrency_key, -1 FROM old_jobs o
                     WHERE o.concurrency_key IS NOT NULL AND o.status = 'running') x
             GROUP BY x.key
            HAVING sum(x.d) <> 0
        ), locked AS MATERIALIZED (
            -- in key order (the lock sits above the sort); a claim holds these already.
            -- Keys as arrays (`= ANY`): probes of the key, never a scan of every key's
            -- row (the fold that fires this trigger no longer turns hash joins off)
            SELECT s.key FROM concurrency_slots s
             WHERE s.key = ANY (ARRAY(SELECT key FROM moved WHERE net > 0))
             ORDER BY s.key FOR UPDATE
        ), counted AS (
            UPDATE concurrency_slots s SET claimed = s.claimed + m.net
              FROM moved m
             WHERE s.key = m.key AND s.key = ANY (ARRAY(SELECT key FROM locked))
        )
        INSERT INTO concurrency_releases (key, released)
        SELECT key, -net FROM moved WHERE net < 0;
    END IF;
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
    INSERT INTO concurrency_releases (key, released)
    SELECT concurrency_key, count(*) FROM old_jobs
     WHERE concurrency_key IS NOT NULL AND status = 'running' GROUP BY 1;
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
