-- Per-key limits set centrally (issue 29: PUT /keys/{key}), and fairness that
-- holds across claims.

-- A key's settings, folded from its stream's KeyConfigured events
-- (definitions/65_flow.sql, flow_project). A key is the value of a job's
-- concurrency_key or fairness_key: concurrency_limit bounds the running jobs of
-- a concurrency key (a job's own limit applies only while the key has none
-- here); weight is a fairness key's turns per rotation; rate_per_second and
-- burst bound how fast the key's jobs start over all queues. A key without a
-- row runs as its jobs say.
CREATE TABLE key_settings (
    id                uuid PRIMARY KEY,   -- the key's stream (derived from its name)
    key               text        NOT NULL UNIQUE,
    version           integer     NOT NULL,
    concurrency_limit integer CHECK (concurrency_limit >= 1),
    weight            integer     NOT NULL DEFAULT 1 CHECK (weight >= 1),
    rate_per_second   double precision,
    burst             integer,
    updated_at        timestamptz NOT NULL,
    last_position     bigint      NOT NULL,
    chain             bytea       NOT NULL
);

-- A rate-limited key's token bucket: state of the claims, not of the log (as
-- queue_buckets), so replay leaves it alone. One row per key: a key's jobs are
-- a small part of the claims, unlike a queue's.
CREATE TABLE key_buckets (
    key         text PRIMARY KEY,
    tokens      double precision NOT NULL,
    refilled_at timestamptz      NOT NULL
);

-- Where each queue's rotation over fairness keys stands (stride scheduling):
-- a key's pass grows by 1/weight for every job of it a claim takes, and every
-- claim takes the jobs of the smallest passes first, so one-slot claims
-- alternate between keys and a claim of N continues where the last one left
-- off. A key that comes (back) after a pause starts at most one turn behind
-- the furthest key (the pass it kept from long ago is no credit). Claim
-- state, not of the log.
CREATE TABLE fairness_turns (
    queue     text             NOT NULL,
    key       text             NOT NULL,
    pass      double precision NOT NULL,
    stride    double precision NOT NULL,   -- 1 / the key's weight, as of its last claim
    taken     bigint           NOT NULL,   -- jobs of the key claimed here so far
    served_at timestamptz      NOT NULL,
    PRIMARY KEY (queue, key)
);
