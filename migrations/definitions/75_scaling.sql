-- Autoscaling on queue depth (deploy/kubernetes: KEDA's postgresql trigger runs
-- `SELECT queue_demand('<queue>', 1000)` every polling interval and scales the
-- runners to ceil(demand / targetQueryValue)).
--
-- Demand = due pending jobs + running jobs. Counting pending jobs alone would
-- scale in the very runners that are busy draining them: with 40 jobs running
-- and 0 waiting, the wanted size is still "enough for 40".
--
-- Pending jobs are counted in the claim index (jobs_claim: queue first, only
-- pending rows) and capped at `cap`: the scaler needs "more than the maximum
-- fleet can take", not an exact count of a million-job backlog, and the cap
-- keeps the probe at a bounded index range. Running jobs come from the
-- counters (queue_counts plus the deltas not folded in yet, see
-- 35_counters.sql), not from a scan of jobs.
CREATE OR REPLACE FUNCTION queue_demand(p_queue text, cap integer DEFAULT 1000)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM (
                SELECT 1 FROM jobs j
                 WHERE j.status = 'pending' AND j.queue = p_queue AND j.run_at <= now()
                 LIMIT greatest(cap, 0)) due)
         + (SELECT coalesce(sum(n), 0) FROM (
                SELECT n FROM queue_counts WHERE queue = p_queue AND status = 'running'
                UNION ALL
                SELECT n FROM queue_count_deltas WHERE queue = p_queue AND status = 'running') c)::bigint
$$;
