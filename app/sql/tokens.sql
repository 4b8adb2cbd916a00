-- name: token_lock
-- A token's row, locked: creating or revoking a name is serialised on it (two
-- revocations at once: the second finds it revoked).
SELECT id, version, name, scope, status FROM tokens WHERE name = %(name)s FOR UPDATE

-- name: token_append
-- One token event, chained to the head of its stream kept on the token's row
-- (locked by token_lock; a new stream starts the chain empty). The statement
-- trigger tokens_project() folds it into `tokens` in this very statement.
INSERT INTO events (stream_type, stream_id, version, type, schema_version, data, occurred_at, actor, hash)
SELECT 'token', %(id)s::uuid, %(version)s::integer, %(type)s, 1::smallint, %(data)s::jsonb, a.at, %(actor)s,
       event_hash((SELECT chain FROM tokens WHERE id = %(id)s::uuid AND %(version)s::integer > 1),
                  'token', %(id)s::uuid, %(version)s::integer, %(type)s, 1::smallint, %(data)s::jsonb,
                  NULL, NULL, a.at, %(actor)s)
  FROM (SELECT now() AS at) a
RETURNING position

-- name: token_list
SELECT name, scope, status, created_by, created_at, revoked_at, revoked_by
  FROM tokens
 WHERE %(all)s OR status = 'active'
 ORDER BY name

-- name: token_authenticate
-- Every request asks (no cache, so a revocation holds at once on every API
-- process): are tokens on at all (any token ever created, revoked ones
-- included: revoking the last token locks the API, it does not reopen it),
-- and which active token has this digest. Two index probes.
SELECT EXISTS (SELECT 1 FROM tokens) AS enabled, t.name, t.scope
  FROM (SELECT 1) one
  LEFT JOIN tokens t ON t.sha256 = %(sha256)s AND t.status = 'active'

-- name: token_active
-- An open stream asks again every few seconds whether its token still works.
SELECT EXISTS (SELECT 1 FROM tokens WHERE name = %(name)s AND status = 'active') AS active

-- name: tokens_exist
SELECT EXISTS (SELECT 1 FROM tokens) AS enabled

-- name: server_key
SELECT key FROM server_keys WHERE name = %(name)s
