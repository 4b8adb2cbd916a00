-- Flow control (issue 16): the fold of the schedule and queue streams, and the
-- running counts of concurrency keys.

-- The fold of the schedule and queue streams into schedules / queue_settings.
-- A statement trigger on the log (so replay's feed table carries it, and
-- `qforge replay --verify` compares the tables); most statements hold none of
-- these events and leave after one look at the set. These streams are few and
-- slow (a tick a second at most per schedule), so they fold event by event.
CREATE OR REPLACE FUNCTION flow_project() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    e record;
    found_rows bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_events x WHERE x.stream_type IN ('schedule', 'queue')) THEN
        RETURN NULL;
    END IF;
    FOR e IN SELECT * FROM new_events x WHERE x.stream_type IN ('schedule', 'queue') ORDER BY x.position LOOP
        IF e.stream_type = 'queue' AND e.version = 1 THEN
            INSERT INTO queue_settings (id, queue, version, paused, rate_per_second, burst, updated_at,
                                        last_position, chain)
            VALUES (e.stream_id, e.data ->> 'queue', 1, e.type = 'QueuePaused',
                    (e.data ->> 'rate_per_second')::float8, (e.data ->> 'burst')::integer,
                    e.occurred_at, e.position, e.hash);
            found_rows := 1;
        ELSIF e.stream_type = 'queue' THEN
            UPDATE queue_settings s SET
                version = e.version, updated_at = e.occurred_at, last_position = e.position, chain = e.hash,
                paused = CASE e.type WHEN 'QueuePaused' THEN true WHEN 'QueueResumed' THEN false
                                     ELSE s.paused END,
                rate_per_second = CASE WHEN e.type = 'QueueConfigured'
                                       THEN (e.data ->> 'rate_per_second')::float8 ELSE s.rate_per_second END,
                burst = CASE WHEN e.type = 'QueueConfigured' THEN (e.data ->> 'burst')::integer ELSE s.burst END
             WHERE s.id = e.stream_id AND s.version = e.version - 1;
            GET DIAGNOSTICS found_rows = ROW_COUNT;
        ELSIF e.version = 1 THEN
            IF e.type <> 'ScheduleCreated' THEN
                RAISE EXCEPTION 'a schedule stream starts with ScheduleCreated, not %', e.type;
            END IF;
            INSERT INTO schedules (id, name, version, spec, paused, next_fire_at, created_at, updated_at,
                                   last_position, chain)
            VALUES (e.stream_id, e.data ->> 'name', 1, e.data -> 'spec', false,
                    (e.data ->> 'next_at')::timestamptz, e.occurred_at, e.occurred_at, e.position, e.hash);
            found_rows := 1;
        ELSIF e.type = 'ScheduleDeleted' THEN
            DELETE FROM schedules s WHERE s.id = e.stream_id AND s.version = e.version - 1;
            GET DIAGNOSTICS found_rows = ROW_COUNT;
        ELSE
            UPDATE schedules s SET
                version = e.version, updated_at = e.occurred_at, last_position = e.position, chain = e.hash,
                spec = CASE WHEN e.type = 'ScheduleUpdated' THEN e.data -> 'spec' ELSE s.spec END,
                paused = CASE e.type WHEN 'SchedulePaused' THEN true WHEN 'ScheduleResumed' THEN false
                                     ELSE s.paused END,
                next_fire_at = CASE WHEN e.type = 'SchedulePaused' THEN s.next_fire_at
                                    ELSE (e.data ->> 'next_at')::timestamptz END,
                last_tick = CASE WHEN e.type = 'ScheduleFired' THEN (e.data ->> 'tick')::timestamptz
                                 ELSE s.last_tick END,
                last_execution_id = CASE WHEN e.type = 'ScheduleFired' THEN (e.data ->> 'execution_id')::uuid
                                         ELSE s.last_execution_id END,
                fired = s.fired + (e.type = 'ScheduleFired')::integer,
                skipped = s.skipped + CASE WHEN e.type = 'ScheduleSkipped' THEN (e.data ->> 'count')::integer
                                           ELSE 0 END
             WHERE s.id = e.stream_id AND s.version = e.version - 1
               AND e.type IN ('ScheduleUpdated', 'SchedulePaused', 'ScheduleResumed', 'ScheduleFired',
                              'ScheduleSkipped');
            GET DIAGNOSTICS found_rows = ROW_COUNT;
        END IF;
        IF found_rows <> 1 THEN
            RAISE EXCEPTION '% event % (version %) does not follow its stream % (a concurrent append, '
                            'an unknown stream or an unknown type)', e.stream_type, e.type, e.version, e.stream_id
                USING ERRCODE = 'unique_violation';
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER events_project_flow AFTER INSERT ON events
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION flow_project();

-- Running jobs per concurrency key, kept by every statement that changes jobs.
-- A key's row is created by its first job; rows are written in key order, so
-- two statements touching several keys cannot deadlock. A statement without
-- keyed jobs leaves after one look at its rows.
CREATE OR REPLACE FUNCTION jobs_concurrency_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_jobs WHERE concurrency_key IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    -- The latest job's limit is the key's (a rewrite only when it changes).
    INSERT INTO concurrency_slots AS s (key, lim, running)
    SELECT concurrency_key, max(concurrency_limit), count(*) FILTER (WHERE status = 'running')
      FROM new_jobs WHERE concurrency_key IS NOT NULL
     GROUP BY concurrency_key ORDER BY concurrency_key
    ON CONFLICT (key) DO UPDATE SET lim = excluded.lim, running = s.running + excluded.running
     WHERE s.lim <> excluded.lim OR excluded.running <> 0;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION jobs_concurrency_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_jobs WHERE concurrency_key IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    WITH delta AS (
        SELECT key, sum(n) AS n
          FROM (SELECT concurrency_key AS key, -1 AS n FROM old_jobs
                 WHERE concurrency_key IS NOT NULL AND status = 'running'
                UNION ALL
                SELECT concurrency_key, 1 FROM new_jobs
                 WHERE concurrency_key IS NOT NULL AND status = 'running') x
         GROUP BY key HAVING sum(n) <> 0
    ), locked AS MATERIALIZED (
        -- in key order (the lock sits above the sort): no deadlock between two statements
        SELECT s.key FROM concurrency_slots s WHERE s.key IN (SELECT key FROM delta)
         ORDER BY s.key FOR UPDATE
    )
    UPDATE concurrency_slots s SET running = s.running + d.n
      FROM delta d
     WHERE s.key = d.key AND s.key IN (SELECT key FROM locked);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION jobs_concurrency_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE concurrency_slots s SET running = s.running - d.n
      FROM (SELECT concurrency_key AS key, count(*) AS n FROM old_jobs
             WHERE concurrency_key IS NOT NULL AND status = 'running' GROUP BY 1) d
     WHERE s.key = d.key;
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER jobs_concurrency_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION jobs_concurrency_insert();
CREATE OR REPLACE TRIGGER jobs_concurrency_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_concurrency_update();
CREATE OR REPLACE TRIGGER jobs_concurrency_delete AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS old_jobs FOR EACH STATEMENT EXECUTE FUNCTION jobs_concurrency_delete();
