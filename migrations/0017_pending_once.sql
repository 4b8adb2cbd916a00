-- A plain pending job was indexed twice: in jobs_claim (every pending job, the
-- queue statistics' and the autoscaler's index) and in jobs_claim_plain (the
-- claim's). Each enqueue paid for both entries (measured: dropping jobs_claim
-- takes 12% off PostgreSQL's CPU per enqueued job), and each claim left a dead
-- entry in both. Now every pending job is in exactly one queue-first index in
-- claim order: jobs_claim_plain, or jobs_pending_flow for the jobs that carry
-- a concurrency or fairness key (which also sit in their own claim index,
-- jobs_claim_keyed / jobs_claim_fair). Readers of "all pending jobs of a
-- queue" read both (queues_stats, queue_demand()).
CREATE INDEX jobs_pending_flow ON jobs (queue, priority DESC, run_at, id)
    WHERE status = 'pending' AND (concurrency_key IS NOT NULL OR fairness_key IS NOT NULL);
DROP INDEX jobs_claim;
