-- The worker registry: which worker processes are alive and what they run, for
-- GET /workers and GET /pods. This is operational state, not an event-sourced
-- projection: it describes processes rather than jobs, each worker overwrites
-- its own row on every heartbeat tick, and replay neither needs nor rebuilds it
-- (what a worker did is already in the job events it appended).
CREATE TABLE workers (
    name        text        PRIMARY KEY,  -- exactly --name (default host-pid)
    host        text        NOT NULL,
    pid         integer     NOT NULL,
    queues      text[]      NOT NULL,
    concurrency integer     NOT NULL,
    -- [{job_id, task, step, workflow_id, started_at, slot}] as of last_seen
    running     jsonb       NOT NULL DEFAULT '[]',
    -- running: heartbeating; stopped: shut down cleanly; gone: the monitor saw
    -- it fall silent (a worker that comes back sets running again)
    status      text        NOT NULL DEFAULT 'running'
                            CHECK (status IN ('running', 'stopped', 'gone')),
    started_at  timestamptz NOT NULL,
    last_seen   timestamptz NOT NULL,
    stopped_at  timestamptz
);

CREATE INDEX workers_live ON workers (last_seen) WHERE status = 'running';
