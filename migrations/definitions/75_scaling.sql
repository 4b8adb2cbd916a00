-- Autoscaling on queue depth (deploy/kubernetes: KEDA's postgresql trigger runs
-- `SELECT queue_demand('<queue>', 1000)` every polling interval and scales the
-- runners to ceil(demand / targetQueryValue)).
--
-- Demand = due pending jobs + running jobs. Counting pending jobs alone would
-- scale in the very runners that are busy draining them: with 40 jobs running
-- and 0 waiting, the wanted size is still "enough for 40".
--
-- Pending jobs are counted in the two queue-first indexes of pending rows
-- (jobs_claim_plain, jobs_pending_flow: each pending job is in one of them)
-- and capped at `cap`: the scaler needs "more than the maximum fleet can
-- take", not an exact count of a million-job backlog, and the cap keeps each
-- probe at a bounded index range. Running jobs come from the
-- counters (queue_counts plus the deltas not folded in yet, see
-- 35_counters.sql), not from a scan of jobs.
CREATE OR REPLACE FUNCTION queue_demand(p_queue text, cap integer DEFAULT 1000)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT least((SELECT count(*) FROM (
                      SELECT 1 FROM jobs j
                       WHERE j.status = 'pending' AND j.queue = p_queue AND j.run_at <= now()
                         AND j.concurrency_key IS NULL AND j.fairness_key IS NULL
                       LIMIT greatest(cap, 0)) plain)
                 + (SELECT count(*) FROM (
                      SELECT 1 FROM jobs j
                       WHERE j.status = 'pending' AND j.queue = p_queue AND j.run_at <= now()
                         AND (j.concurrency_key IS NOT NULL OR j.fairness_key IS NOT NULL)
                       LIMIT greatest(cap, 0)) flow), greatest(cap, 0))
         + (SELECT coalesce(sum(n), 0) FROM (
                SELECT n FROM queue_counts WHERE queue = p_queue AND status = 'running'
                UNION ALL
                SELECT n FROM queue_count_deltas WHERE queue = p_queue AND status = 'running') c)::bigint
$$;

-- When the oldest due pending job of a queue became due (NULL: none is due),
-- for GET /queues: per priority, the first entry of each of the two pending
-- indexes in claim order (priority DESC, run_at) is that priority's oldest, so
-- a loose index scan makes one probe per distinct priority, whatever the
-- backlog. The two walks are written out, not one walk with a parameter: each
-- names its index's predicate (jobs_claim_plain, jobs_pending_flow) literally,
-- which is what lets the planner use the index for every probe.
CREATE OR REPLACE FUNCTION queue_oldest_due(p_queue text)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    WITH RECURSIVE plain(priority, run_at) AS (
        (SELECT j.priority, j.run_at FROM jobs j
          WHERE j.status = 'pending' AND j.queue = p_queue
            AND j.concurrency_key IS NULL AND j.fairness_key IS NULL
          ORDER BY j.priority DESC, j.run_at LIMIT 1)
        UNION ALL
        SELECT n.priority, n.run_at
          FROM plain p
         CROSS JOIN LATERAL (SELECT j.priority, j.run_at FROM jobs j
                              WHERE j.status = 'pending' AND j.queue = p_queue
                                AND j.concurrency_key IS NULL AND j.fairness_key IS NULL
                                AND j.priority < p.priority
                              ORDER BY j.priority DESC, j.run_at LIMIT 1) n
    ), flow(priority, run_at) AS (
        (SELECT j.priority, j.run_at FROM jobs j
          WHERE j.status = 'pending' AND j.queue = p_queue
            AND (j.concurrency_key IS NOT NULL OR j.fairness_key IS NOT NULL)
          ORDER BY j.priority DESC, j.run_at LIMIT 1)
        UNION ALL
        SELECT n.priority, n.run_at
          FROM flow f
         CROSS JOIN LATERAL (SELECT j.priority, j.run_at FROM jobs j
                              WHERE j.status = 'pending' AND j.queue = p_queue
                                AND (j.concurrency_key IS NOT NULL OR j.fairness_key IS NOT NULL)
                                AND j.priority < f.priority
                              ORDER BY j.priority DESC, j.run_at LIMIT 1) n
    )
    SELECT min(run_at) FILTER (WHERE run_at <= now())
      FROM (SELECT run_at FROM plain UNION ALL SELECT run_at FROM flow) firsts
$$;
