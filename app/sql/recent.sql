-- name: events_recent_after
-- The dashboard's charts, folded from the log since a gapless cursor (same
-- visibility rule as events_after): finished attempts by outcome, and the
-- enqueue-to-start latency of claims (Claimed minus the moment the job became
-- claimable, as in events_counts_after), both per time bucket of `bucket`
-- seconds. Latencies are counted in log-scale bins (bin = 1 + floor(10 * log10
-- of the seconds, from 1 ms)), so pages and buckets add up and a percentile
-- needs no list of samples.
WITH visible AS (
    SELECT e.xid, e.position, e.type, e.stream_id, e.version, e.occurred_at,
           floor(extract(epoch FROM e.occurred_at) / %(bucket)s)::bigint AS slot
      FROM events_after_page(%(after_xid)s::xid8, %(after_position)s::bigint, %(limit)s) e
), latency AS (
    SELECT v.slot,
           greatest(0, least(80, 1 + floor(10 * log(greatest(
               extract(epoch FROM v.occurred_at - ready.at)::float8, 0.001)::numeric / 0.001))))::int AS bin
      FROM visible v
     CROSS JOIN LATERAL (SELECT job_ready_at(v.stream_id, v.version, %(ready_types)s::text[]) AS at) ready
     WHERE v.type = 'Claimed' AND v.occurred_at > now() - make_interval(secs => %(window)s)
)
SELECT (SELECT jsonb_agg(jsonb_build_array(slot, type, n))
          FROM (SELECT slot, type, count(*) AS n FROM visible
                 WHERE type IN ('Succeeded', 'Failed', 'DeadLettered', 'Cancelled')
                 GROUP BY slot, type) o) AS outcomes,
       (SELECT jsonb_agg(jsonb_build_array(slot, bin, n))
          FROM (SELECT slot, bin, count(*) AS n FROM latency GROUP BY slot, bin) l) AS latencies,
       (SELECT count(*) FROM visible) AS read,
       (SELECT xid::text FROM visible ORDER BY xid DESC, position DESC LIMIT 1) AS last_xid,
       (SELECT position FROM visible ORDER BY xid DESC, position DESC LIMIT 1) AS last_position
