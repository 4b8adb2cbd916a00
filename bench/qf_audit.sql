-- The baseline of bench/qf_audit.py, installed only in its own scratch
-- databases: the log without its hash chain, to price the hashing.

-- name: bench_without_hash
-- Every event gets the same 32 zero bytes (the column's CHECK wants 32): the
-- canonical encoding and SHA-256 are skipped, everything else stays.
CREATE OR REPLACE FUNCTION event_hash(prev bytea, stream_type text, stream_id uuid, version integer,
                                      type text, schema_version smallint, data jsonb, tags jsonb,
                                      workflow_id uuid, occurred_at timestamptz, actor text)
RETURNS bytea LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea
$$

-- name: bench_without_hash_fixed
-- The same for the form of appends that compute the encoding's shared part once.
CREATE OR REPLACE FUNCTION event_hash_fixed(prev bytea, stream_id uuid, version integer, fixed bytea,
                                            workflow_id uuid, tags jsonb, data jsonb)
RETURNS bytea LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea
$$
