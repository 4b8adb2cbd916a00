-- Least privilege (issue 30). A token's secret digest leaves the token
-- projection for a table of its own that only the schema owner reads: the
-- processes' roles (definitions/90_roles.sql) ask token_check() instead, a
-- SECURITY DEFINER function that answers yes or no. New TokenCreated events
-- carry no digest (name, scope; the stream id is the token's non-secret id);
-- the digests already in old events stay as they were written (the log is
-- hash-chained: rewriting them would break every audit proof that covers
-- them). Readers never see them: event_upcast_data() drops the field
-- (definitions/10_log.sql), so /events, histories and the stream do not serve
-- them; and a digest of a 256-bit random secret does not authenticate anyone.
-- token_secrets is not a projection: replay rebuilds `tokens` from the log and
-- leaves this table alone.
CREATE TABLE token_secrets (
    id         uuid        PRIMARY KEY,             -- the token's stream id (tokens.id)
    sha256     text        NOT NULL,                -- hex digest of the current secret
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX token_secrets_sha256 ON token_secrets (sha256);
INSERT INTO token_secrets (id, sha256) SELECT id, sha256 FROM tokens;
ALTER TABLE tokens DROP COLUMN sha256;
