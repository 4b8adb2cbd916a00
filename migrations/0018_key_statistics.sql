-- The claim walks each fairness key's pending jobs (job_claim: `fair`) and each
-- concurrency key's (`keyed`) in that key's own index, jobs_claim_fair /
-- jobs_claim_keyed. jobs_pending_flow (0017) also holds those jobs, in queue
-- order: a walk of it filtered on the key is as good only while the key is the
-- whole queue. The planner chose between the two from the column's statistics:
-- analyzed while one tenant's backlog was all there was (one distinct key), it
-- saw a key as the whole table, took jobs_pending_flow as the cheaper index,
-- and then every claim of a newcomer's job walked the whole backlog to find it
-- (50 ms instead of 6 with 100,000 jobs of tenant A queued; once a second, the
-- tail of fairness's bench figure). A key is a small part of the jobs wherever
-- these features are used, so the estimate says so: each key about one job in
-- twenty (negative n_distinct: a fraction of the rows), whatever the sample.
-- ALTER ... SET (n_distinct) does not block reads or writes; ANALYZE applies it.
ALTER TABLE jobs ALTER COLUMN fairness_key SET (n_distinct = -0.05);
ALTER TABLE jobs ALTER COLUMN concurrency_key SET (n_distinct = -0.05);
ANALYZE jobs (fairness_key, concurrency_key);
