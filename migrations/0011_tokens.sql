-- Named API tokens with scopes (issue 19). The log holds their lifecycle
-- (stream type 'token': TokenCreated, TokenRevoked); `tokens` is the
-- projection folded from it by tokens_project() (definitions/70_tokens.sql),
-- rebuilt by replay like jobs and workflows. Only a SHA-256 of each secret is
-- ever stored: the secret is printed once by `qforge token create`.
CREATE TABLE tokens (
    id            uuid        PRIMARY KEY,          -- the token's stream id
    version       integer     NOT NULL,
    name          text        NOT NULL,
    scope         text        NOT NULL,
    sha256        text        NOT NULL,             -- hex digest of the secret
    status        text        NOT NULL,             -- active | revoked (state machine 'token')
    created_by    text        NOT NULL,
    created_at    timestamptz NOT NULL,
    revoked_at    timestamptz,
    revoked_by    text,
    last_position bigint      NOT NULL,
    chain         bytea       NOT NULL              -- head of the stream's hash chain
);
-- A name is one stream for ever (a revoked name can be created again: a new
-- secret on the same stream); requests find their token by the digest.
CREATE UNIQUE INDEX tokens_name ON tokens (name);
CREATE INDEX tokens_sha256 ON tokens (sha256);

-- Secrets of the server itself, made here once per database so that every API
-- process signs and checks stream tickets with the same key, without a setting.
-- gen_random_uuid() draws from the server's strong random source.
CREATE TABLE server_keys (
    name       text        PRIMARY KEY,
    key        bytea       NOT NULL CHECK (octet_length(key) >= 32),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO server_keys (name, key)
SELECT 'stream_ticket', sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text
                                          || gen_random_uuid()::text || clock_timestamp()::text, 'UTF8'));
