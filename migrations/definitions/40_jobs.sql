-- Retry delay after counted attempt n: min(base * 2^(n-1), cap) plus up to
-- jitter_ratio of it, so a flapping dependency is not hammered in lockstep.
CREATE OR REPLACE FUNCTION job_backoff_seconds(n integer, base double precision, cap double precision,
                                    jitter double precision)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT least(base * power(2::double precision, greatest(n, 1) - 1), cap) * (1 + jitter)
$$;
