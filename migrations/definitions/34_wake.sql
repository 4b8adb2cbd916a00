-- Waking one idle worker, not every worker (issue 33). A worker whose claim
-- came up short (it has free slots and saw nothing more to do) adds a row here
-- naming its own channel, `qforge_wake_<pid of its listening connection>`; a
-- statement that makes jobs claimable now takes the longest-waiting such rows
-- (enough of their free slots for its jobs) and notifies those channels only,
-- with the queue as payload: each woken worker claims at once, and the others
-- sleep on instead of each claiming once in vain. With no row to take, it
-- notifies `qforge_jobs`, which every worker hears, as before; so does a job
-- due later (workers set a timer on it). A row is taken once: the worker adds
-- another when a claim of its comes up short again. A row whose listening
-- backend has ended is dropped and the next row taken (a row of a worker too old
-- to say its pid costs one job a poll interval, once); a woken worker without a
-- free slot passes the notification on to `qforge_jobs`.
--
-- Handing a new job to an idle worker (the single job's path). A waiting
-- worker that says its name in its row takes jobs handed to it: a statement that
-- creates a few plain jobs due now (no flow control on them or their queue, no
-- workflow) claims them for the longest-waiting such worker in its own
-- transaction (the Claimed event, chained and folded as a worker's claim would
-- append it, actor the worker) and notifies its channel with the claimed jobs
-- themselves, so the worker starts them without a claim of its own: a round
-- trip, a commit and two thread hops fewer between enqueue and start. A row
-- whose listening connection is gone (its backend has ended) is dropped, not
-- handed to. A worker that has no free slot when the jobs arrive hands them
-- back (Released); one that dies before it hears them leaves them running
-- without heartbeats, and the monitor recovers them as stale, as after any
-- claim of a worker that died.
--
-- Unlogged: who waits is no part of the log, and after a crash nobody waits.
CREATE UNLOGGED TABLE IF NOT EXISTS job_waiters (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- the order they began to wait in
    channel text NOT NULL,
    queues  text[] NOT NULL,
    slots   integer NOT NULL CHECK (slots > 0)
);
-- The waiting worker's name: set, it takes jobs handed to it (jobs_hand); NULL: wake it only.
ALTER TABLE job_waiters ADD COLUMN IF NOT EXISTS worker text;
-- The backend pid of its listening connection: the row is handed to only while that backend lives.
ALTER TABLE job_waiters ADD COLUMN IF NOT EXISTS pid integer;

-- Wake workers for `jobs` jobs of `queue` due at `due` (35_counters.sql calls it
-- from the statement triggers on jobs, once per queue of the statement). SKIP
-- LOCKED: two enqueues at once take two different waiters, and neither waits
-- for the other's commit.
CREATE OR REPLACE FUNCTION jobs_wake(queue text, due timestamptz, jobs bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    waiter record;
    covered bigint := 0;
BEGIN
    IF due > now() THEN
        PERFORM pg_notify('qforge_jobs', queue || ' ' || extract(epoch FROM due));
        RETURN;
    END IF;
    WHILE covered < jobs LOOP
        DELETE FROM job_waiters w
         WHERE w.id = (SELECT x.id FROM job_waiters x WHERE queue = ANY(x.queues)
                        ORDER BY x.id LIMIT 1 FOR UPDATE SKIP LOCKED)
        RETURNING w.channel, w.slots, w.pid INTO waiter;
        EXIT WHEN waiter IS NULL;
        -- a row whose listening backend has ended is dropped (a worker too old to say its pid: woken)
        CONTINUE WHEN waiter.pid IS NOT NULL AND NOT EXISTS (SELECT FROM pg_stat_get_activity(waiter.pid));
        PERFORM pg_notify(waiter.channel, queue);
        covered := covered + waiter.slots;
    END LOOP;
    IF covered = 0 THEN
        PERFORM pg_notify('qforge_jobs', queue);
    END IF;
END $$;

-- At most this many new jobs of a queue in one statement are handed to workers;
-- a larger batch wakes them instead (they claim it in their own batches).
CREATE OR REPLACE FUNCTION jobs_hand_limit() RETURNS integer LANGUAGE sql IMMUTABLE AS 'SELECT 16';

-- New jobs of `queue` arrive (35_counters.sql, once per queue of an inserting
-- statement): `jobs` of them pending, the earliest due at `due`; `plain`: those
-- that may be handed to a worker, in claim order. Hands what it can, wakes
-- workers for the rest.
CREATE OR REPLACE FUNCTION jobs_arrive(queue text, due timestamptz, jobs bigint, plain uuid[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    handed integer := 0;
BEGIN
    -- a transaction that began over a second ago may commit much later: its claim would
    -- look stale to the monitor before the worker heard of it; those jobs wake workers
    -- (pg_trigger_depth() = 2: these rows are the fold of an append to the log, not a replay's swap)
    IF cardinality(plain) > 0 AND jobs <= jobs_hand_limit() AND clock_timestamp() - now() < interval '1 second'
       AND pg_trigger_depth() = 2 THEN
        handed := jobs_hand(queue, plain);
    END IF;
    IF jobs > handed THEN
        PERFORM jobs_wake(queue, due, jobs - handed);
    END IF;
END $$;

-- Claim the pending jobs `ids` (plain, due now, of `queue`, in claim order) for
-- the longest-waiting live workers that take handed jobs, each up to its free
-- slots, and notify each its jobs (a JSON array of what a claim returns, with
-- `at`: when they were claimed; ids only when that is too long for a
-- notification). Returns how many were handed. SECURITY DEFINER (90_roles.sql):
-- the roles that enqueue may not append Claimed themselves; this appends it only
-- for jobs it has just checked are pending and plain, for a worker that asked.
CREATE OR REPLACE FUNCTION jobs_hand(queue text, ids uuid[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    waiter record;
    handed integer := 0;
    taken integer;
    message text;
BEGIN
    IF EXISTS (SELECT FROM queue_settings s
                WHERE s.queue = jobs_hand.queue AND (s.paused OR s.rate_per_second IS NOT NULL)) THEN
        RETURN 0;
    END IF;
    WHILE handed < cardinality(ids) LOOP
        DELETE FROM job_waiters w
         WHERE w.id = (SELECT x.id FROM job_waiters x
                        WHERE jobs_hand.queue = ANY(x.queues) AND x.worker IS NOT NULL
                        ORDER BY x.id LIMIT 1 FOR UPDATE SKIP LOCKED)
        RETURNING w.channel, w.slots, w.worker, w.pid INTO waiter;
        EXIT WHEN waiter IS NULL;
        -- its worker is gone (pg_stat_get_activity(NULL) would list every backend)
        CONTINUE WHEN waiter.pid IS NULL OR NOT EXISTS (SELECT FROM pg_stat_get_activity(waiter.pid));
        WITH picked AS MATERIALIZED (
            SELECT j.id, j.version, j.attempts, j.workflow_id, j.chain, j.task, j.queue, j.payload,
                   j.timeout_seconds, j.step, j.tags, j.trace, jsonb_build_object('attempt', j.attempts + 1) AS data
              FROM jobs j
             WHERE j.id = ANY(ids[handed + 1 : handed + waiter.slots]) AND j.status = 'pending'
               AND j.queue = jobs_hand.queue AND j.run_at <= now() AND j.workflow_id IS NULL
               AND j.concurrency_key IS NULL AND j.fairness_key IS NULL
               FOR UPDATE SKIP LOCKED
        ), claimed AS (
            -- the Claimed events as job_claim_record (app/sql/jobs.sql) appends them: same data, same
            -- chain (tests/test_hand.py verifies the audit's chains and the replay over them)
            INSERT INTO events (stream_type, stream_id, version, type, data, workflow_id, occurred_at, actor, hash)
            SELECT 'job', p.id, p.version + 1, 'Claimed', p.data, p.workflow_id, now(), waiter.worker,
                   event_hash_fixed(p.chain, p.id, p.version + 1,
                                    event_canonical_v1_fixed(1::smallint, now(), 'job', 'Claimed', waiter.worker),
                                    p.workflow_id, NULL, p.data)
              FROM picked p
        )
        SELECT count(*), jsonb_agg(jsonb_build_object(
                   'id', p.id, 'task', p.task, 'queue', p.queue, 'payload', p.payload, 'attempt', p.attempts + 1,
                   'timeout_seconds', p.timeout_seconds, 'step', p.step, 'tags', p.tags, 'trace', p.trace,
                   'at', extract(epoch FROM now())))::text
          INTO taken, message
          FROM picked p;
        IF taken > 0 THEN
            IF octet_length(message) > 7500 THEN  -- a notification holds at most 8000 bytes
                SELECT jsonb_agg(jsonb_build_object('id', x.id, 'at', extract(epoch FROM now())))::text
                  INTO message FROM unnest(ids[handed + 1 : handed + waiter.slots]) AS x(id)
                 WHERE EXISTS (SELECT FROM jobs j WHERE j.id = x.id AND j.status = 'running'
                                  AND j.worker = waiter.worker);
            END IF;
            PERFORM pg_notify(waiter.channel, message);
        ELSE  -- none of them claimable after all: woken as jobs_wake would, it claims and waits again
            PERFORM pg_notify(waiter.channel, queue);
        END IF;
        handed := handed + least(waiter.slots, cardinality(ids) - handed);
    END LOOP;
    RETURN handed;
END $$;
