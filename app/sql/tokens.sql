-- name: token_lock
-- A token's row, locked: creating or revoking a name is serialised on it (two
-- revocations at once: the second finds it revoked). Through token_lock(): the
-- processes' roles may not lock (nor update) `tokens` themselves.
SELECT id, version, name, scope, status FROM token_lock(%(name)s)

-- name: token_write
-- One token event and the secret's digest, through token_write() (a SECURITY
-- DEFINER function: the processes' roles append no token event themselves).
SELECT token_write(%(caller_secret)s, %(id)s::uuid, %(version)s::integer, %(type)s, %(data)s::jsonb,
                   %(actor)s, %(sha256)s) AS position

-- name: token_list
SELECT name, scope, status, created_by, created_at, revoked_at, revoked_by
  FROM tokens
 WHERE %(all)s OR status = 'active'
 ORDER BY name

-- name: token_authenticate
-- Are tokens on, and which active token has this digest (token_check(), since
-- only the schema owner reads the digests).
SELECT enabled, name, scope FROM token_check(%(sha256)s)

-- name: token_active
-- An open stream asks again every few seconds whether its token still works.
SELECT EXISTS (SELECT 1 FROM tokens WHERE name = %(name)s AND status = 'active') AS active

-- name: tokens_exist
SELECT EXISTS (SELECT 1 FROM tokens) AS enabled

-- name: server_key
SELECT key FROM server_keys WHERE name = %(name)s

-- name: stream_ticket_mac
SELECT stream_ticket_mac(%(payload)s::bytea) AS mac
