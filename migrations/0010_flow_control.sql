-- Flow control (issue 16): schedules, queue settings (pause, rate limit),
-- concurrency per key and fairness between tenants.

-- The fields a job may carry (from its Enqueued event; null: not in use).
ALTER TABLE jobs ADD COLUMN concurrency_key text,
                 ADD COLUMN concurrency_limit integer,
                 ADD COLUMN fairness_key text;

-- The claim walks three kinds of pending jobs, each in the claim's own order:
-- plain ones (like jobs_claim, which the queue statistics keep reading, but
-- without the jobs the other two serve, so a backlog of keyed or fair jobs
-- never sits in the plain scan's way), jobs with a
-- concurrency key (per key, only for keys with a free slot) and jobs with a
-- fairness key (per queue and key, round-robin). The two new indexes are empty,
-- and cost nothing, while the features are not in use.
CREATE INDEX jobs_claim_plain ON jobs (queue, priority DESC, run_at, id)
    WHERE status = 'pending' AND concurrency_key IS NULL AND fairness_key IS NULL;
CREATE INDEX jobs_claim_keyed ON jobs (concurrency_key, priority DESC, run_at, id)
    WHERE status = 'pending' AND concurrency_key IS NOT NULL;
CREATE INDEX jobs_claim_fair ON jobs (queue, fairness_key, priority DESC, run_at, id)
    WHERE status = 'pending' AND fairness_key IS NOT NULL AND concurrency_key IS NULL;

-- How many jobs of each concurrency key run now: claimed (a counter kept by
-- the claims, which hold the key's row) less released (rows appended by
-- whatever ends a running job, without touching the key's row, so a finishing
-- job never waits for a claim nor a claim for it). Both only grow; the monitor
-- sums released rows per key. A claim locks the key's row, reads claimed from
-- it (the newest value) and the released rows of its snapshot (perhaps not the
-- newest: it may under-use a slot for a moment, never exceed the limit).
-- Kept by triggers on jobs (definitions/65_flow.sql).
CREATE TABLE concurrency_slots (
    key     text PRIMARY KEY,
    lim     integer NOT NULL CHECK (lim >= 1),   -- the limit of the key's latest job
    claimed bigint  NOT NULL DEFAULT 0
);
CREATE TABLE concurrency_releases (
    key      text   NOT NULL,
    released bigint NOT NULL
);
CREATE INDEX concurrency_releases_key ON concurrency_releases (key);
INSERT INTO concurrency_slots (key, lim, claimed)
SELECT concurrency_key, max(concurrency_limit), count(*) FILTER (WHERE status = 'running')
  FROM jobs WHERE concurrency_key IS NOT NULL GROUP BY concurrency_key;

-- Queue settings, folded from the queue streams' events (QueueConfigured,
-- QueuePaused, QueueResumed). A queue without a row runs unthrottled.
CREATE TABLE queue_settings (
    id              uuid PRIMARY KEY,   -- the queue's stream (derived from its name)
    queue           text        NOT NULL UNIQUE,
    version         integer     NOT NULL,
    paused          boolean     NOT NULL DEFAULT false,
    rate_per_second double precision,
    burst           integer,
    updated_at      timestamptz NOT NULL,
    last_position   bigint      NOT NULL,
    chain           bytea       NOT NULL
);

-- The token bucket of a rate-limited queue: state of the claims, not of the
-- log (a claim spends tokens without an event), so replay leaves it alone.
CREATE TABLE queue_buckets (
    queue       text PRIMARY KEY,
    tokens      double precision NOT NULL,
    refilled_at timestamptz      NOT NULL
);

-- Schedules, folded from their streams (ScheduleCreated ... ScheduleDeleted).
-- next_fire_at comes from the events (computed from the cron expression when
-- they were written), so replay rebuilds it without a cron parser.
CREATE TABLE schedules (
    id            uuid PRIMARY KEY,
    name          text        NOT NULL UNIQUE,
    version       integer     NOT NULL,
    spec          jsonb       NOT NULL,
    paused        boolean     NOT NULL DEFAULT false,
    next_fire_at  timestamptz,
    last_tick     timestamptz,
    last_execution_id uuid,
    fired         integer     NOT NULL DEFAULT 0,
    skipped       integer     NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    last_position bigint      NOT NULL,
    chain         bytea       NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE NOT paused;
