-- name: job_enqueue_input
-- The new jobs of job_enqueue and job_enqueue_keyed (their CTE `input`, where
-- they say `-- include: job_enqueue_input`), at the same now() for all.
SELECT j.id, j.data, nullif(j.tags, '{}') AS tags, j.workflow_id,
       coalesce(%(now)s::timestamptz, now()) AS at
  FROM jsonb_to_recordset(%(jobs)s::jsonb) AS j(id uuid, data jsonb, tags jsonb, workflow_id uuid)

-- name: job_enqueue_append
-- Their Enqueued events, and job_enqueue_many's (where they say
-- `-- include: job_enqueue_append`),
-- one per row of `input`. A stream's first event carries its tags; its hash
-- starts the stream's chain (event_hash_fixed: the encoding's part shared by
-- the statement's events is computed once, see 10_log.sql).
INSERT INTO events (stream_type, stream_id, version, type, data, tags, workflow_id, occurred_at, actor,
                    hash)
SELECT 'job', i.id, 1, 'Enqueued', i.data, i.tags, i.workflow_id, i.at, %(actor)s,
       event_hash_fixed(NULL, i.id, 1, (SELECT event_canonical_v1_fixed(1::smallint,
                            coalesce(%(now)s::timestamptz, now()), 'job', 'Enqueued', %(actor)s)),
                        i.workflow_id, i.tags, i.data)
  FROM input i

-- name: job_enqueue
-- One Enqueued event per new job; events_project() creates the rows.
-- (Jobs with an idempotency key go through job_enqueue_keyed.)
WITH input AS (
    -- include: job_enqueue_input
)
-- include: job_enqueue_append

-- name: job_enqueue_keyed
-- The same, where some jobs carry an idempotency key: the key goes into
-- idempotency_keys first, and a repeated key conflicts there and its job is
-- not appended (ON CONFLICT waits for a concurrent inserter, so two racing
-- enqueues with one key make one job).
WITH input AS (
    -- include: job_enqueue_input
), keyed AS (
    INSERT INTO idempotency_keys (stream_type, key, stream_id)
    SELECT 'job', i.data ->> 'idempotency_key', i.id FROM input i WHERE i.data ? 'idempotency_key'
    ON CONFLICT DO NOTHING
    RETURNING stream_id
)
-- include: job_enqueue_append
 WHERE NOT i.data ? 'idempotency_key' OR i.id IN (SELECT stream_id FROM keyed)
RETURNING stream_id

-- name: job_enqueue_many
-- job_enqueue for a batch that shares its task and options (qforge.enqueue_many):
-- the shared Enqueued data comes once, and a job's payload, when it has one, is
-- added to it here, so no document per job is built by the caller or parsed
-- by the database. ids: a uuid[]; payloads: a JSON array beside them (null, or
-- null and {} in it: no payload; ROWS FROM pads the shorter list with nulls).
WITH input AS (
    SELECT j.id,
           CASE WHEN j.payload IS NULL OR j.payload IN ('null', '{}') THEN %(data)s::jsonb
                ELSE %(data)s::jsonb || jsonb_build_object('payload', j.payload) END AS data,
           nullif(%(tags)s::jsonb, '{}') AS tags, NULL::uuid AS workflow_id,
           coalesce(%(now)s::timestamptz, now()) AS at
      FROM ROWS FROM (unnest(%(ids)s::uuid[]), jsonb_array_elements(%(payloads)s::jsonb)) AS j(id, payload)
)
-- include: job_enqueue_append

-- name: job_ids_by_idempotency_key
SELECT stream_id, key FROM idempotency_keys WHERE stream_type = 'job' AND key = ANY(%(keys)s::text[])

-- name: job_claim_plan
-- The claim's plan is the same for every call (its parts are each an index
-- walk in claim order), but the planner, estimating the generic plan of a
-- statement this size above the custom ones, would plan it afresh on every
-- call: about half of the claim's own CPU (measured, bench/qf_flow.py --parts
-- cpu). For the claim's transaction only.
SET LOCAL plan_cache_mode = force_generic_plan

-- name: job_claim_plan_session
-- The same for a whole session: a worker's connection, which claims over and
-- over. The claim then needs no SET LOCAL, and alone no transaction: one round
-- trip after a wake-up instead of four. The worker's other statements (reports,
-- heartbeats, the workflow steps a report advances) find rows by key, which a
-- generic plan does as well as a custom one, once instead of at every call.
SET plan_cache_mode = force_generic_plan

-- name: job_claim_record
-- The Claimed events of job_claim (included where it says
-- `-- include: job_claim_record`): from `picked` (and `clock`), chained to each
-- job's last hash (which the row lock holds still), folded by
-- events_project(); this CTE runs whether or not it is read: every picked row
-- gets its event.
INSERT INTO events (stream_type, stream_id, version, type, data, workflow_id, occurred_at, actor, hash)
SELECT 'job', p.id, p.version + 1, 'Claimed', p.data, p.workflow_id, c.at, %(worker)s,
       event_hash_fixed(p.chain, p.id, p.version + 1,
                        (SELECT event_canonical_v1_fixed(1::smallint, at, 'job', 'Claimed', %(worker)s) FROM clock),
                        p.workflow_id, NULL, p.data)
  FROM picked p, clock c

-- name: job_claim_spend
-- The end of both claim statements (included where they say
-- `-- include: job_claim_spend`, in a CTE `spent`): the rate-limited queues'
-- bucket shards (`bucket`), refilled to now, less what this claim took.
UPDATE queue_buckets b
   SET tokens = k.tokens - (SELECT count(*) FROM picked p WHERE p.queue = k.queue),
       refilled_at = (SELECT at FROM clock)
  FROM bucket k
 WHERE b.queue = k.queue AND b.shard = k.shard

-- name: job_claim_plain
-- The claim when no job in reach has a concurrency or fairness key (the usual
-- case), as one small statement: the full claim below costs about a fifth more
-- PostgreSQL CPU per job even when its flow parts find nothing (a plan of
-- ~100 nodes set up and torn down on every call, the round-robin sorts).
-- `gate` decides in the statement's own snapshot: with a pending keyed job
-- anywhere, or a pending job with a fairness key in these queues, it claims
-- nothing and returns one row of nulls, and the caller runs job_claim in the
-- same transaction; so a plain claim never passes over such jobs. Paused
-- queues are left out and rate-limited ones spend their tokens here as in
-- job_claim (queue_buckets_take). Otherwise as job_claim: rows locked FOR
-- UPDATE SKIP LOCKED in claim order. Then, unlike job_claim, the statement
-- folds its Claimed events itself (job_fold_claimed: one UPDATE of the locked
-- rows by their address, whose RETURNING gives each event its position and
-- hash, chained to the row's), appends them, and tells events_project() so
-- (jobs_folded, 30_fold.sql): the trigger's fold would find each row again by
-- its key and apply every event type's rules to it (issue 33).
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::timestamptz, now()) AS at,
           event_canonical_v1_fixed(1::smallint, coalesce(%(now)s::timestamptz, now()), 'job', 'Claimed',
                                    %(worker)s) AS fixed
), gate AS MATERIALIZED (
    -- two probes of partial indexes that are empty while the features are not in use,
    -- each from the index's newest end: a flow backlog's oldest entries are the jobs
    -- claimed since the last vacuum, dead, and a probe from the front walked them all
    -- (as EXISTS the planner even scanned the table when flow jobs were most of it:
    -- 10-40 ms a probe, once a second per worker, while a 100,000-job backlog drained)
    SELECT (SELECT true FROM jobs j WHERE j.status = 'pending' AND j.concurrency_key IS NOT NULL
             ORDER BY j.concurrency_key DESC, j.priority, j.run_at DESC, j.id DESC LIMIT 1) IS NULL
       AND (SELECT true FROM unnest(%(queues)s::text[]) AS q(queue)
             CROSS JOIN LATERAL (SELECT FROM jobs j
                                  WHERE j.status = 'pending' AND j.queue = q.queue
                                    AND j.fairness_key IS NOT NULL AND j.concurrency_key IS NULL
                                  ORDER BY j.fairness_key DESC, j.priority, j.run_at DESC, j.id DESC
                                  LIMIT 1) f
             LIMIT 1) IS NULL AS plain
), flow AS MATERIALIZED (
    SELECT q.queue, s.rate_per_second
      FROM unnest(%(queues)s::text[]) AS q(queue)
      LEFT JOIN queue_settings s ON s.queue = q.queue
     WHERE s.paused IS NOT TRUE AND (SELECT plain FROM gate)
), bucket AS MATERIALIZED (
    SELECT * FROM queue_buckets_take(%(queues)s::text[], (SELECT at FROM clock)) WHERE (SELECT plain FROM gate)
), picked AS MATERIALIZED (
    SELECT c.*
      FROM flow f
      LEFT JOIN bucket b ON b.queue = f.queue
     CROSS JOIN LATERAL (
            SELECT j.ctid AS tid, j.id, j.attempts, j.tags, j.workflow_id, j.priority, j.run_at,
                   j.task, j.queue, j.payload, j.timeout_seconds, j.step, j.trace
              FROM jobs j
             WHERE j.status = 'pending' AND j.queue = f.queue
               AND j.concurrency_key IS NULL AND j.fairness_key IS NULL
               AND j.run_at <= (SELECT at FROM clock)
             ORDER BY j.priority DESC, j.run_at, j.id
             LIMIT CASE WHEN f.rate_per_second IS NULL THEN %(limit)s
                        ELSE least(%(limit)s, coalesce(b.allowed, 0)) END
               FOR UPDATE SKIP LOCKED) c
     ORDER BY c.priority DESC, c.run_at, c.id
     LIMIT %(limit)s
), folded AS (
    -- the fold of the Claimed events (30_fold.sql's rules for Claimed), each locked row
    -- by its address; its RETURNING is the events' (position, hash) for `claimed`
    UPDATE jobs j SET
        -- include: job_fold_claimed
     WHERE j.ctid = ANY (ARRAY(SELECT a.tid FROM picked a))
    RETURNING j.id, j.version, j.workflow_id, j.last_position, j.chain,
              jsonb_build_object('attempt', j.attempts) AS data, j.updated_at AS at
), missed AS MATERIALIZED (
    SELECT ARRAY(SELECT m.id FROM picked m WHERE m.id NOT IN (SELECT id FROM folded)) AS ids
), refolded AS (
    -- a row changed by another transaction between this statement's snapshot and its lock
    -- (the lock took the newest version, which the snapshot does not see at its address):
    -- by its key, from the version the snapshot sees (older than the locked one), whose
    -- update follows the row to the locked version and checks the quals again there
    UPDATE jobs j SET
        -- include: job_fold_claimed
     WHERE j.id = ANY ((SELECT ids FROM missed)::uuid[])
    RETURNING j.id, j.version, j.workflow_id, j.last_position, j.chain,
              jsonb_build_object('attempt', j.attempts) AS data, j.updated_at AS at
), confirmed AS MATERIALIZED (
    SELECT jobs_folded((SELECT count(*) FROM picked),
                       (SELECT count(*) FROM folded) + (SELECT count(*) FROM refolded)) AS ok
), claimed AS (
    INSERT INTO events (position, stream_type, stream_id, version, type, data, workflow_id, occurred_at, actor,
                        hash)
    SELECT f.last_position, 'job', f.id, f.version, 'Claimed', f.data, f.workflow_id, f.at, %(worker)s, f.chain
      FROM (SELECT * FROM folded UNION ALL SELECT * FROM refolded) f, confirmed
), spent AS (
    -- include: job_claim_spend
)
SELECT p.id, p.task, p.queue, p.payload, p.attempts + 1 AS attempt, p.timeout_seconds,
       p.workflow_id, p.step, p.tags, p.trace
  FROM gate g
  LEFT JOIN picked p ON true
 WHERE p.id IS NOT NULL OR NOT g.plain  -- not plain: one row of nulls, "run job_claim"
 ORDER BY p.priority DESC, p.run_at, p.id

-- name: job_fold_claimed
-- The fold of a Claimed event (30_fold.sql's rules for it) as job_claim_plain
-- applies it (included after `UPDATE jobs j SET`): the event's position and
-- hash become the row's, and the RETURNING of the UPDATE gives them to the INSERT.
version = j.version + 1, updated_at = (SELECT at FROM clock), last_position = nextval('events_position_seq'),
chain = event_hash_fixed(j.chain, j.id, j.version + 1, (SELECT fixed FROM clock), j.workflow_id, NULL,
                         jsonb_build_object('attempt', j.attempts + 1)),
status = coalesce(state_target('job', j.status, 'Claimed', NULL),
                  state_refuse('job', j.status, 'Claimed', NULL, j.id)),
attempts = j.attempts + 1, worker = %(worker)s,
heartbeat_at = (SELECT at FROM clock), started_at = (SELECT at FROM clock)

-- name: job_claim
-- The claim is one statement (this one or job_claim_plain). It locks claimable rows with FOR UPDATE SKIP
-- LOCKED, walking partial claim indexes in their own order (priority DESC,
-- run_at, id), so concurrent claimers skip each other's rows instead of
-- waiting; each CTE is an optimisation fence that keeps its LIMIT inside its
-- index scan. The Claimed events are inserted in the same statement (chained to
-- each job's last hash, which the row lock holds still), and events_project()
-- folds them into the rows (status running, attempts + 1) before it ends. Time
-- is a parameter so tests control the clock.
--
-- Flow control (claim() runs this statement when job_claim_plain finds jobs
-- with a concurrency or fairness key in reach): a paused queue is left out; a
-- rate-limited queue's tokens come from one shard of its bucket, locked
-- (queue_buckets_take), and bound that queue's share; jobs with a concurrency
-- key come only from keys with a free slot (the key's row is locked), at most
-- the free slots each (the key's configured concurrency_limit, else its jobs');
-- a rate-limited key (key_settings) spends its own bucket, locked in key order;
-- jobs with a fairness key come per key, and within a priority the claim takes
-- them in the order of the queue's rotation (fairness_turns, migration 0020):
-- the i-th job of a key in this claim stands at the key's pass + i / weight,
-- the smallest first, and the passes move on by what the claim took, so the
-- next claim, of any size, continues where this one left off. Jobs without a
-- fairness key stand at the front of the rotation (as one more key).
WITH RECURSIVE clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::timestamptz, now()) AS at
), flow AS MATERIALIZED (
    SELECT q.queue, s.rate_per_second, s.burst
      FROM unnest(%(queues)s::text[]) AS q(queue)
      LEFT JOIN queue_settings s ON s.queue = q.queue
     WHERE s.paused IS NOT TRUE
), bucket AS MATERIALIZED (
    -- the rate-limited queues' tokens: one shard of each bucket, locked
    SELECT * FROM queue_buckets_take(%(queues)s::text[], (SELECT at FROM clock))
), quota AS MATERIALIZED (
    SELECT f.queue, least(%(limit)s, CASE WHEN f.rate_per_second IS NULL THEN %(limit)s
                                          ELSE coalesce(b.allowed, 0) END) AS allowed
      FROM flow f LEFT JOIN bucket b ON b.queue = f.queue
), plain AS MATERIALIZED (
    SELECT c.*, 'p'::text AS kind, ''::text AS rot
      FROM quota qu
     CROSS JOIN LATERAL (
            SELECT j.id, j.version, j.attempts, j.tags, j.workflow_id, j.priority, j.run_at,
                   j.task, j.queue, j.payload, j.timeout_seconds, j.step, j.chain, j.fairness_key, j.trace
              FROM jobs j
             WHERE j.status = 'pending' AND j.queue = qu.queue
               AND j.concurrency_key IS NULL AND j.fairness_key IS NULL
               AND j.run_at <= (SELECT at FROM clock)
             ORDER BY j.priority DESC, j.run_at, j.id
             LIMIT qu.allowed
               FOR UPDATE SKIP LOCKED) c
), ready AS MATERIALIZED (
    -- Keys with a free slot and pending jobs here: the released rows of this
    -- snapshot (perhaps not the newest, never too many) and one probe per key
    -- (a scalar subquery: as EXISTS the planner would hash all keyed jobs).
    -- The releases are summed in one pass (per key, the generic plan scanned
    -- them all again for every key: most of a keyed claim's CPU between two
    -- compactions). A key's limit is its configured one, else its jobs'.
    SELECT s.key, coalesce(r.released, 0) AS released
      FROM concurrency_slots s
      LEFT JOIN (SELECT x.key, sum(x.released) AS released FROM concurrency_releases x GROUP BY x.key) r
             ON r.key = s.key
      LEFT JOIN key_settings ks ON ks.key = s.key
     WHERE coalesce(ks.concurrency_limit, s.lim) - s.claimed + coalesce(r.released, 0) > 0
       AND (SELECT true FROM jobs j WHERE j.status = 'pending' AND j.concurrency_key = s.key
               AND j.queue = ANY(%(queues)s::text[])
             -- from the key's newest entries: its oldest are the jobs claimed since
             -- the last vacuum, dead, and a forward probe walked them all
             ORDER BY j.priority, j.run_at DESC, j.id DESC LIMIT 1)
), tenants(queue, key) AS (
    -- per queue, the fairness keys with pending jobs: a skip scan of jobs_claim_fair
    -- (ORDER BY ... LIMIT 1 rather than max(): the planner then knows each step is
    -- one index probe, and the claim's estimate stays far below jit_above_cost).
    -- Downwards: each step lands on the previous key's last entry, a job queued
    -- lately and still pending; upwards it landed on the next key's first
    -- entries, its claimed jobs (dead until a vacuum), and walked them all.
    SELECT qu.queue, (SELECT j.fairness_key FROM jobs j
                       WHERE j.status = 'pending' AND j.queue = qu.queue
                         AND j.fairness_key IS NOT NULL AND j.concurrency_key IS NULL
                       ORDER BY j.fairness_key DESC LIMIT 1)
      FROM quota qu WHERE qu.allowed > 0
    UNION ALL
    SELECT t.queue, (SELECT j.fairness_key FROM jobs j
                      WHERE j.status = 'pending' AND j.queue = t.queue
                        AND j.fairness_key < t.key AND j.concurrency_key IS NULL
                      ORDER BY j.fairness_key DESC LIMIT 1)
      FROM tenants t WHERE t.key IS NOT NULL
), key_bucket AS MATERIALIZED (
    -- The rate-limited keys in reach: their buckets, refilled to now and locked in
    -- key order (a key's rate holds over all queues, so its claimers take turns).
    -- key_settings is small, and without rate-limited keys this finds nothing.
    SELECT k.key, x.tokens, floor(x.tokens)::integer AS allowed
      FROM key_settings k
      JOIN key_buckets b ON b.key = k.key
     CROSS JOIN LATERAL (SELECT bucket_tokens_at(k.burst, k.rate_per_second, 1, b.tokens, b.refilled_at,
                                                 (SELECT at FROM clock)) AS tokens) x
     WHERE k.rate_per_second IS NOT NULL
       AND (k.key IN (SELECT r.key FROM ready r) OR k.key IN (SELECT t.key FROM tenants t))
     ORDER BY k.key
       FOR UPDATE OF b
), slots AS MATERIALIZED (
    -- Half of them at most, locked SKIP LOCKED in random order (a key in
    -- another claim is passed over, never waited for; two claimers at once
    -- share the keys). A key's claimed count is read from its locked row (the
    -- newest), so the limit holds.
    SELECT s.key, least(coalesce(ks.concurrency_limit, s.lim) - s.claimed + r.released,
                        coalesce(kb.allowed, %(limit)s)) AS free
      FROM concurrency_slots s JOIN ready r ON r.key = s.key
      LEFT JOIN key_settings ks ON ks.key = s.key
      LEFT JOIN key_bucket kb ON kb.key = s.key
     WHERE coalesce(ks.concurrency_limit, s.lim) - s.claimed + r.released > 0
       AND coalesce(kb.allowed, 1) > 0
     ORDER BY random()
     LIMIT (SELECT ceil(count(*) / 2.0) FROM ready)
       FOR UPDATE OF s SKIP LOCKED
), keyed AS MATERIALIZED (
    SELECT c.*, 'c'::text AS kind, s.key AS rot
      FROM slots s
     CROSS JOIN LATERAL (
            SELECT j.id, j.version, j.attempts, j.tags, j.workflow_id, j.priority, j.run_at,
                   j.task, j.queue, j.payload, j.timeout_seconds, j.step, j.chain, j.fairness_key, j.trace
              FROM jobs j
             WHERE j.status = 'pending' AND j.concurrency_key = s.key
               AND j.queue IN (SELECT queue FROM quota WHERE allowed > 0)
               AND j.run_at <= (SELECT at FROM clock)
             ORDER BY j.priority DESC, j.run_at, j.id
             -- a share of the batch per key: locking `limit` rows of every key
             -- to keep `limit` of them all would cost a lock per row for nothing
             LIMIT least(s.free, ceil(%(limit)s::float8 / (SELECT count(*) FROM slots))::integer)
               FOR UPDATE SKIP LOCKED) c
), turns AS MATERIALIZED (
    -- each fairness key's place in its queue's rotation: its pass, but at most one
    -- turn behind the furthest key here (a key back after a pause has no credit from
    -- long ago; a new key starts there too), and its weight
    SELECT t.queue, t.key, 1.0::float8 / coalesce(ks.weight, 1) AS stride, f.served_at,
           coalesce(greatest(f.pass, max(f.pass) OVER (PARTITION BY t.queue) - 1), 0) AS pass,
           coalesce(ks.weight, 1)::float8 / sum(coalesce(ks.weight, 1)) OVER (PARTITION BY t.queue) AS portion
      FROM (SELECT x.queue, x.key FROM tenants x WHERE x.key IS NOT NULL
            UNION ALL
            -- the jobs without a fairness key, as one more key ('', a name no key has)
            SELECT DISTINCT x.queue, '' FROM tenants x WHERE x.key IS NOT NULL) t
      LEFT JOIN key_settings ks ON ks.key = t.key
      LEFT JOIN fairness_turns f ON f.queue = t.queue AND f.key = t.key
), shares AS MATERIALIZED (
    -- each key's share of its queue's batch, by weight (one more job than its portion:
    -- a key ahead in the rotation may take a turn more than its portion), and no more
    -- than a rate-limited key's tokens
    SELECT t.*, least(qu.allowed, ceil(qu.allowed * t.portion)::integer + 1,
                      coalesce(kb.allowed, qu.allowed)) AS share
      FROM turns t
      JOIN quota qu ON qu.queue = t.queue
      LEFT JOIN key_bucket kb ON kb.key = t.key
), fair AS MATERIALIZED (
    -- Alike in shape to `keyed` above, on purpose: each LATERAL walks its own partial
    -- index (by concurrency key there, by fairness key here) with its own limit; one
    -- LATERAL over both would lose the index scans the claim relies on.
    SELECT c.*, 'f'::text AS kind, t.key AS rot
      FROM shares t
     CROSS JOIN LATERAL (
            SELECT j.id, j.version, j.attempts, j.tags, j.workflow_id, j.priority, j.run_at,
                   j.task, j.queue, j.payload, j.timeout_seconds, j.step, j.chain, j.fairness_key, j.trace
              FROM jobs j
             WHERE j.status = 'pending' AND j.queue = t.queue AND j.fairness_key = t.key
               AND j.concurrency_key IS NULL
               AND j.run_at <= (SELECT at FROM clock)
             ORDER BY j.priority DESC, j.run_at, j.id
             -- the key's share of the batch (see keyed)
             LIMIT t.share
               FOR UPDATE SKIP LOCKED) c
     WHERE t.share > 0 AND t.key <> ''
), front AS MATERIALIZED (
    -- per queue, the front of the rotation: where jobs with a concurrency key stand
    SELECT s.queue, min(s.pass) AS pass FROM shares s GROUP BY s.queue
), numbered AS (
    -- nth: the job's place among its key's jobs in this claim
    SELECT c.*, row_number() OVER (PARTITION BY c.queue, c.kind, c.rot
                                   ORDER BY c.priority DESC, c.run_at, c.id) - 1 AS nth
      FROM (SELECT * FROM plain UNION ALL SELECT * FROM keyed UNION ALL SELECT * FROM fair) c
), ranked AS (
    -- vstart: the job's place in the rotation, its key's pass plus a stride per job of
    -- the key before it in this claim (rounded: strides of 1/3 must add up to 1 exactly).
    -- Ties go to a key's first job in this claim, then to the key served least recently.
    SELECT c.*, round((coalesce(s.pass, fr.pass, 0) + c.nth * coalesce(s.stride, 1))::numeric, 9) AS vstart,
           s.served_at AS key_served_at
      FROM numbered c
      LEFT JOIN shares s ON c.kind IN ('f', 'p') AND s.queue = c.queue AND s.key = c.rot
      LEFT JOIN front fr ON fr.queue = c.queue
), placed AS (
    -- place: in its queue's batch; keyplace: among its key's jobs of every queue (a key's rate
    -- bounds them all)
    SELECT r.*, row_number() OVER (PARTITION BY r.queue ORDER BY r.priority DESC, r.vstart, r.nth,
                                   r.key_served_at NULLS FIRST, r.rot, r.run_at, r.id) AS place,
           row_number() OVER (PARTITION BY r.kind = 'p', r.rot ORDER BY r.priority DESC, r.vstart, r.nth,
                              r.run_at, r.id) AS keyplace
      FROM ranked r
), picked AS MATERIALIZED (
    SELECT p.*, jsonb_build_object('attempt', p.attempts + 1) AS data
      FROM placed p JOIN quota qu ON qu.queue = p.queue
      LEFT JOIN key_bucket kb ON kb.key = p.rot AND p.kind <> 'p'
     WHERE p.place <= qu.allowed AND p.keyplace <= coalesce(kb.allowed, %(limit)s)
     ORDER BY p.priority DESC, p.vstart, p.nth, p.key_served_at NULLS FIRST, p.rot, p.run_at, p.id
     LIMIT %(limit)s
), claimed AS (
    -- include: job_claim_record
), spent AS (
    -- include: job_claim_spend
), turned AS (
    -- the rotation moves on by what this claim took (a concurrent claim of the same
    -- key waits for this one's row and adds its own share to the newest pass)
    INSERT INTO fairness_turns AS f (queue, key, pass, stride, taken, served_at)
    SELECT p.queue, p.rot, s.pass + count(*) * s.stride, s.stride, count(*), (SELECT at FROM clock)
      FROM picked p JOIN shares s ON s.queue = p.queue AND s.key = p.rot
     WHERE p.kind IN ('f', 'p')
     GROUP BY p.queue, p.rot, s.pass, s.stride
     ORDER BY p.queue, p.rot
    ON CONFLICT (queue, key) DO UPDATE
       SET pass = greatest(f.pass, excluded.pass - excluded.taken * excluded.stride)
                  + excluded.taken * excluded.stride,
           stride = excluded.stride, taken = f.taken + excluded.taken, served_at = excluded.served_at
), key_spent AS (
    UPDATE key_buckets b
       SET tokens = k.tokens - (SELECT count(*) FROM picked p WHERE p.rot = k.key AND p.kind <> 'p'),
           refilled_at = (SELECT at FROM clock)
      FROM key_bucket k
     WHERE b.key = k.key
)
SELECT p.id, p.task, p.queue, p.payload, p.attempts + 1 AS attempt, p.timeout_seconds,
       p.workflow_id, p.step, p.tags, p.trace
  FROM picked p
 ORDER BY p.priority DESC, p.vstart, p.nth, p.key_served_at NULLS FIRST, p.rot, p.run_at, p.id

-- name: job_current_attempt
-- The fence of the reports that lock before they append (job_heartbeat,
-- job_fail, job_release; included where they say `-- include: job_current_attempt`,
-- inside a CTE `fenced`, after a CTE `fence(event)` naming their event type;
-- job_complete fences on the same terms in the UPDATE that folds it):
-- the reported jobs whose current attempt the report names and whose status
-- allows that event, locked in id order (so two reporters cannot deadlock),
-- with the report's fields and the statement's time. A report for a
-- superseded attempt, or for a job that moved on (cancelled, re-claimed),
-- matches no row and changes nothing. attempts > 0: a waiting step may take
-- Succeeded or Failed, but never from a worker's report (no worker claimed it).
-- The ids also as an array, whose `= ANY` is a probe of jobs' key: joined to
-- the reports alone, a worker's generic plan (job_claim_plan_session) made
-- while jobs was small hashed them and scanned jobs, every report after (a
-- one-job completion: 1.8 ms of CPU at 5,000 jobs, growing with the table).
SELECT j.id, j.version, j.workflow_id, j.chain, j.attempts, j.free_attempts, j.max_retries,
       j.backoff_base_seconds, j.backoff_cap_seconds, r.result, r.reason, r.error, r.permanent,
       coalesce(%(now)s::timestamptz, now()) AS at
  FROM jobs j
  JOIN jsonb_to_recordset(%(reports)s::jsonb)
       AS r(id uuid, attempt integer, result jsonb, reason text, error text, permanent boolean)
    ON r.id = j.id AND r.attempt = j.attempts
 WHERE j.id = ANY (ARRAY(SELECT (x ->> 'id')::uuid FROM jsonb_array_elements(%(reports)s::jsonb) x))
   AND j.attempts > 0 AND state_allows('job', j.status, (SELECT event FROM fence))
 ORDER BY j.id
   FOR UPDATE OF j

-- name: job_report_append
-- The event of job_heartbeat and job_release (included where
-- they say `-- include: job_report_append`, after their CTE `target`: the
-- fenced rows and each one's event data), chained to the job's last hash.
INSERT INTO events (stream_type, stream_id, version, type, data, workflow_id, occurred_at, actor, hash)
SELECT 'job', t.id, t.version + 1, f.event, t.data, t.workflow_id, t.at, %(actor)s,
       event_hash_fixed(t.chain, t.id, t.version + 1,
                        (SELECT event_canonical_v1_fixed(1::smallint, coalesce(%(now)s::timestamptz, now()),
                                                         'job', f.event, %(actor)s) FROM fence f),
                        t.workflow_id, NULL, t.data)
  FROM target t, fence f

-- name: job_heartbeat
-- Fenced (job_current_attempt): only the current attempt of a running job may
-- beat. Rows that do not match are not returned, and the worker stops those tasks.
WITH fence(event) AS (VALUES ('Heartbeat')), fenced AS (
    -- include: job_current_attempt
), target AS (
    SELECT f.*, jsonb_build_object('attempt', f.attempts) AS data FROM fenced f
)
-- include: job_report_append
RETURNING stream_id AS id

-- name: job_complete
-- Fenced batch completion, folded in this statement: one UPDATE finds each
-- reported job whose current attempt the report names and whose status allows
-- Succeeded (as job_current_attempt), applies the event to it (30_fold.sql's
-- rules for Succeeded) and gives the event's position, hash and data to the
-- INSERT that appends it; then jobs_folded (30_fold.sql). A report for a
-- superseded attempt, or for a job that moved on, matches no row and changes
-- nothing. Rows are taken in id order (the reports sorted, and the key probed
-- as an array), as every fenced report locks them, so two reporters cannot
-- deadlock; the UPDATE's own row lock is the fence's, and a row another
-- transaction changed meanwhile is updated in its newest version (the chain
-- continues from its hash). A result of null is not written (the fold reads
-- its absence as null).
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::timestamptz, now()) AS at,
           event_canonical_v1_fixed(1::smallint, coalesce(%(now)s::timestamptz, now()), 'job', 'Succeeded',
                                    %(actor)s) AS fixed
), reported AS MATERIALIZED (
    SELECT r.id, r.attempt,
           jsonb_build_object('attempt', r.attempt)
           || CASE WHEN r.result IS NULL OR r.result = 'null' THEN '{}'::jsonb
                   ELSE jsonb_build_object('result', r.result) END AS data
      FROM jsonb_to_recordset(%(reports)s::jsonb) AS r(id uuid, attempt integer, result jsonb)
     ORDER BY r.id
), folded AS (
    UPDATE jobs j SET
        version = j.version + 1, updated_at = c.at, last_position = nextval('events_position_seq'),
        chain = event_hash_fixed(j.chain, j.id, j.version + 1, c.fixed, j.workflow_id, NULL, r.data),
        status = coalesce(state_target('job', j.status, 'Succeeded', NULL),
                          state_refuse('job', j.status, 'Succeeded', NULL, j.id)),
        result = coalesce(r.data -> 'result', 'null'::jsonb), finished_at = c.at
      FROM reported r, clock c
     WHERE j.id = ANY (ARRAY(SELECT x.id FROM reported x)) AND j.id = r.id AND j.attempts = r.attempt
       AND j.attempts > 0 AND state_allows('job', j.status, 'Succeeded')
    RETURNING j.id, j.version, j.workflow_id, j.last_position, j.chain, r.data, c.at
), confirmed AS MATERIALIZED (
    SELECT jobs_folded(count(*), count(*)) AS ok FROM folded
)
INSERT INTO events (position, stream_type, stream_id, version, type, data, workflow_id, occurred_at, actor, hash)
SELECT f.last_position, 'job', f.id, f.version, 'Succeeded', f.data, f.workflow_id, f.at, %(actor)s, f.chain
  FROM folded f, confirmed
RETURNING stream_id AS id, workflow_id

-- name: job_fail
-- Fenced (job_current_attempt) batch failure. Each failed attempt appends
-- Failed and, in the same statement, Retried (backoff min(base*2^(n-1), cap)
-- plus jitter, n counting only attempts that use the budget) or DeadLettered
-- once n > max_retries (or at once for a permanent failure).
-- This is the one place where a worker's job becomes dead. The second event's
-- hash chains to the first's.
WITH fence(event) AS (VALUES ('Failed')), fenced AS (
    -- include: job_current_attempt
), target AS (
    SELECT f.*,
           -- a permanent failure (report.PERMANENT_REASONS) dead-letters whatever budget is left
           f.attempts - f.free_attempts > f.max_retries OR coalesce(f.permanent, false) AS exhausted,
           -- a job's own retry policy (a stored definition's), else the settings
           job_backoff_seconds(f.attempts - f.free_attempts, coalesce(f.backoff_base_seconds, %(base)s),
                               coalesce(f.backoff_cap_seconds, %(cap)s), random() * %(jitter)s) AS delay,
           jsonb_build_object('attempt', f.attempts, 'reason', coalesce(f.reason, 'error'),
                              'error', f.error)
           || CASE WHEN f.result IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('result', f.result) END AS failed
      FROM fenced f
), outcome AS (
    SELECT t.*,
           CASE WHEN t.exhausted THEN 'DeadLettered' ELSE 'Retried' END AS then_type,
           CASE WHEN t.exhausted
                THEN jsonb_build_object('attempt', t.attempts, 'error', t.failed ->> 'error')
                ELSE jsonb_build_object('attempt', t.attempts, 'delay_seconds', t.delay,
                                        'run_at', t.at + make_interval(secs => t.delay))
           END AS then_data,
           event_hash(t.chain, 'job', t.id, t.version + 1, 'Failed', 2::smallint, t.failed, NULL,
                      t.workflow_id, t.at, %(actor)s) AS failed_hash
      FROM target t
)
INSERT INTO events (stream_type, stream_id, version, type, schema_version, data, workflow_id,
                    occurred_at, actor, hash)
SELECT 'job', o.id, o.version + x.n, x.type, x.schema_version, x.data, o.workflow_id, o.at, %(actor)s,
       x.hash
  FROM outcome o
 CROSS JOIN LATERAL (VALUES
        (1, 'Failed', 2::smallint, o.failed, o.failed_hash),
        (2, o.then_type, 1::smallint, o.then_data,
         event_hash(o.failed_hash, 'job', o.id, o.version + 2, o.then_type, 1::smallint, o.then_data,
                    NULL, o.workflow_id, o.at, %(actor)s))
       ) AS x(n, type, schema_version, data, hash)
 ORDER BY o.id, x.n
RETURNING stream_id AS id, type, workflow_id, (data ->> 'run_at')::timestamptz AS retry_at

-- name: job_lock
-- Lock jobs (in id order, so two lockers cannot deadlock) to decide on them.
SELECT * FROM jobs WHERE id = ANY(%(ids)s::uuid[]) ORDER BY id FOR UPDATE

-- name: job_get
SELECT * FROM jobs WHERE id = %(id)s

-- name: job_workflow_ids
SELECT DISTINCT workflow_id FROM jobs
 WHERE id = ANY(%(ids)s::uuid[]) AND workflow_id IS NOT NULL

-- name: job_stale
-- Running jobs whose worker stopped beating (the monitor fails them).
SELECT id, attempts AS attempt, worker, workflow_id FROM jobs
 WHERE status = 'running' AND heartbeat_at < %(cutoff)s
 ORDER BY heartbeat_at
 LIMIT %(limit)s

-- name: job_due_timers
-- Waiting steps whose time has come: a sleep ends, a trigger wait times out.
SELECT id, step_type, workflow_id, sleep_seconds FROM jobs
 WHERE status = 'waiting' AND run_at <= coalesce(%(now)s::timestamptz, now())
 ORDER BY run_at
 LIMIT %(limit)s

-- name: job_next_due
-- When the earliest pending job of these queues that is not due yet comes due
-- (epoch seconds), for the worker's timer when its listener (re)connects: the
-- notifications of later enqueues and retries say so themselves. Walks the
-- queues' pending jobs: once per connection, never per claim.
SELECT extract(epoch FROM min(j.run_at))::float8 AS due
  FROM jobs j
 WHERE j.status = 'pending' AND j.queue = ANY(%(queues)s::text[]) AND j.run_at > now()
