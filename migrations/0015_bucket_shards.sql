-- A rate-limited queue's token bucket, split into shards (issue 16: every
-- claimer of a rate-limited queue locked its one bucket row, so claimers took
-- turns). Each shard holds `share` of the bucket: it refills at rate * share
-- up to burst * share. A bucket with room for several batches (queue_bucket_set
-- decides) gets several shards and a claim takes the fullest one that no other
-- claim holds (SKIP LOCKED), so claimers no longer wait for each other; the
-- shards' rates sum to the queue's rate, so the limit holds over time. A small
-- bucket stays one shard (share 1) that claimers wait for, exactly as before.
-- Existing buckets become that single shard.
ALTER TABLE queue_buckets
    ADD COLUMN shard smallint NOT NULL DEFAULT 0 CHECK (shard >= 0),
    ADD COLUMN share double precision NOT NULL DEFAULT 1 CHECK (share > 0 AND share <= 1);
ALTER TABLE queue_buckets DROP CONSTRAINT queue_buckets_pkey, ADD PRIMARY KEY (queue, shard);
