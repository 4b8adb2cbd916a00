-- Waking one idle worker, not every worker (issue 33). A worker whose claim
-- came up short (it has free slots and saw nothing more to do) adds a row here
-- naming its own channel, `qforge_wake_<pid of its listening connection>`; a
-- statement that makes jobs claimable now takes the longest-waiting such rows
-- (enough of their free slots for its jobs) and notifies those channels only,
-- with the queue as payload: each woken worker claims at once, and the others
-- sleep on instead of each claiming once in vain. With no row to take, it
-- notifies `qforge_jobs`, which every worker hears, as before; so does a job
-- due later (workers set a timer on it). A row is taken once: the worker adds
-- another when a claim of its comes up short again. A row whose worker is gone
-- costs one job a poll interval, once; a woken worker without a free slot
-- passes the notification on to `qforge_jobs`.
--
-- Unlogged: who waits is no part of the log, and after a crash nobody waits.
CREATE UNLOGGED TABLE IF NOT EXISTS job_waiters (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- the order they began to wait in
    channel text NOT NULL,
    queues  text[] NOT NULL,
    slots   integer NOT NULL CHECK (slots > 0)
);

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
        RETURNING w.channel, w.slots INTO waiter;
        EXIT WHEN waiter IS NULL;
        PERFORM pg_notify(waiter.channel, queue);
        covered := covered + waiter.slots;
    END LOOP;
    IF covered = 0 THEN
        PERFORM pg_notify('qforge_jobs', queue);
    END IF;
END $$;
