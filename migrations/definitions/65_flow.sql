-- Flow control (issue 16): the fold of the schedule, queue and key streams, and the
-- running counts of concurrency keys.

-- The fold of the schedule, queue and key streams into schedules / queue_settings /
-- key_settings.
-- Called by events_project() (30_fold.sql) with a statement's events of the
-- rare streams (so replay's feed table folds them too, and `qforge replay
-- --verify` compares the tables). These streams are few and slow (a tick a
-- second at most per schedule), so they fold event by event.

-- Once its own statement trigger: each costs every append a call (issue 33).
DROP TRIGGER IF EXISTS events_project_flow ON events;
DROP FUNCTION IF EXISTS flow_project();

CREATE OR REPLACE FUNCTION flow_fold(new_events events[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    e record;
    found_rows bigint;
BEGIN
    FOR e IN SELECT * FROM unnest(new_events) x WHERE x.stream_type IN ('schedule', 'queue', 'key')
              ORDER BY x.position LOOP
        IF e.stream_type = 'key' THEN
            -- KeyConfigured carries the key's whole settings (its only event type)
            IF e.type <> 'KeyConfigured' THEN
                RAISE EXCEPTION 'a key stream holds KeyConfigured events, not %', e.type;
            END IF;
            IF e.version = 1 THEN
                INSERT INTO key_settings (id, key, version, concurrency_limit, weight, rate_per_second, burst,
                                          updated_at, last_position, chain)
                VALUES (e.stream_id, e.data ->> 'key', 1, (e.data ->> 'concurrency_limit')::integer,
                        coalesce((e.data ->> 'weight')::integer, 1), (e.data ->> 'rate_per_second')::float8,
                        (e.data ->> 'burst')::integer, e.occurred_at, e.position, e.hash);
                found_rows := 1;
            ELSE
                UPDATE key_settings k SET
                    version = e.version, updated_at = e.occurred_at, last_position = e.position, chain = e.hash,
                    concurrency_limit = (e.data ->> 'concurrency_limit')::integer,
                    weight = coalesce((e.data ->> 'weight')::integer, 1),
                    rate_per_second = (e.data ->> 'rate_per_second')::float8,
                    burst = (e.data ->> 'burst')::integer
                 WHERE k.id = e.stream_id AND k.version = e.version - 1;
                GET DIAGNOSTICS found_rows = ROW_COUNT;
            END IF;
        ELSIF e.stream_type = 'queue' AND e.version = 1 THEN
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
END $$;

-- Running jobs per concurrency key (see concurrency_slots, migration 0010) are
-- kept by the statements on jobs, in the counters' triggers (35_counters.sql).

-- One released row per key (the monitor's leader, every tick). The rows it
-- replaces and the one it writes have the same sum, and a reader's snapshot
-- sees either the former or the latter: never both, never neither.
CREATE OR REPLACE FUNCTION concurrency_compact() RETURNS bigint LANGUAGE sql AS $$
    WITH moved AS (
        DELETE FROM concurrency_releases RETURNING key, released
    ), summed AS (
        INSERT INTO concurrency_releases (key, released)
        SELECT key, sum(released) FROM moved GROUP BY key
        RETURNING key
    )
    SELECT (SELECT count(*) FROM moved) - (SELECT count(*) FROM summed)
$$;

-- How many jobs of each key run now (tests, operators, GET /keys); lim is the
-- limit in force: the key's configured one (PUT /keys/{key}), else its jobs'.
CREATE OR REPLACE VIEW concurrency_running AS
SELECT s.key, coalesce((SELECT ks.concurrency_limit FROM key_settings ks WHERE ks.key = s.key), s.lim) AS lim,
       s.claimed - coalesce((SELECT sum(r.released) FROM concurrency_releases r
                             WHERE r.key = s.key), 0) AS running
  FROM concurrency_slots s;

-- A bucket shard's tokens at `at`: refilled at its share of the rate since it
-- was last refilled, up to its share of the burst. (SQL, so it is inlined.)
CREATE OR REPLACE FUNCTION bucket_tokens_at(burst double precision, rate double precision, share double precision,
                                            tokens double precision, refilled_at timestamptz, at timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT least(burst * share, tokens + rate * share * greatest(extract(epoch FROM at - refilled_at)::float8, 0))
$$;

-- The token buckets of a claim's rate-limited queues (see migration 0015),
-- locked, with their tokens refilled to `at`: a single-shard bucket is waited
-- for (in queue order, so claims of several queues cannot deadlock); of a
-- sharded one, the fullest shard that no other claim holds is taken (SKIP
-- LOCKED: claimers of one queue take different shards instead of taking
-- turns). A rate-limited queue without a row here has no tokens for this
-- claim. Paused queues are left out (the claim leaves them out anyway).
-- plpgsql so that its plans are kept for the session (a sql function is
-- planned again in every statement that calls it). ROWS 1: at most a shard
-- per queue, and usually none; at the default estimate of 1,000 rows the
-- claim's generic plan walked a 100,000-job fairness backlog instead of
-- probing it (120 ms per claim of 8 instead of 5 ms).
CREATE OR REPLACE FUNCTION queue_buckets_take(queues text[], at timestamptz)
RETURNS TABLE (queue text, shard smallint, tokens double precision, allowed integer)
LANGUAGE plpgsql VOLATILE ROWS 1 AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM queue_settings s WHERE s.queue = ANY(queues) AND s.rate_per_second IS NOT NULL
                      AND NOT s.paused) THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT b.queue, b.shard, x.tokens, floor(x.tokens)::integer
      FROM queue_buckets b
      JOIN queue_settings s ON s.queue = b.queue AND s.rate_per_second IS NOT NULL AND NOT s.paused
     CROSS JOIN LATERAL (SELECT bucket_tokens_at(s.burst, s.rate_per_second, b.share, b.tokens, b.refilled_at, at)
                                AS tokens) x
     WHERE b.queue = ANY(queues) AND b.share = 1
     ORDER BY b.queue
       FOR UPDATE OF b;
    RETURN QUERY
    SELECT k.queue, k.shard, k.tokens, floor(k.tokens)::integer
      FROM queue_settings s
     CROSS JOIN LATERAL (
            SELECT b.queue, b.shard, x.tokens
              FROM queue_buckets b
             CROSS JOIN LATERAL (SELECT bucket_tokens_at(s.burst, s.rate_per_second, b.share, b.tokens,
                                                         b.refilled_at, at) AS tokens) x
             WHERE b.queue = s.queue AND b.share < 1
             ORDER BY x.tokens DESC
             LIMIT 1
               FOR UPDATE OF b SKIP LOCKED) k
     WHERE s.queue = ANY(queues) AND s.rate_per_second IS NOT NULL AND NOT s.paused;
END $$;
