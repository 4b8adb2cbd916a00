-- The fold of token events into `tokens` (issue 19). Called by
-- events_project() (30_fold.sql) with a statement's events of the rare
-- streams, so replay's feed table folds them too and, with the scratch schema
-- first on the search path, rebuilds `tokens` like the other projections.
-- Token events are rare (an operator's command): row by row is plenty, and
-- the state machine ('token' in qforge.events.states) guards each.
-- The secret's digest is not here (token_secrets, migration 0021): old events
-- carry one, and the fold ignores it.

-- Once its own statement trigger: each costs every append a call (issue 33).
DROP TRIGGER IF EXISTS tokens_project ON events;
DROP FUNCTION IF EXISTS tokens_project();

CREATE OR REPLACE FUNCTION tokens_fold(new_events events[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    e record;
    found_rows bigint;
BEGIN
    FOR e IN SELECT * FROM unnest(new_events) x WHERE x.stream_type = 'token' ORDER BY x.position LOOP
        IF e.type = 'TokenCreated' AND e.version = 1 THEN
            PERFORM coalesce(state_target('token', NULL, e.type, NULL),
                             state_refuse('token', NULL, e.type, NULL, e.stream_id));
            INSERT INTO tokens (id, version, name, scope, status, created_by, created_at,
                                last_position, chain)
            VALUES (e.stream_id, e.version, e.data ->> 'name', e.data ->> 'scope',
                    state_target('token', NULL, e.type, NULL), e.actor, e.occurred_at, e.position, e.hash);
        ELSE
            UPDATE tokens t SET
                version = e.version,
                status = coalesce(state_target('token', t.status, e.type, NULL),
                                  state_refuse('token', t.status, e.type, NULL, e.stream_id)),
                -- created again after a revocation: a new secret, maybe a new scope
                scope = CASE WHEN e.type = 'TokenCreated' THEN e.data ->> 'scope' ELSE t.scope END,
                created_by = CASE WHEN e.type = 'TokenCreated' THEN e.actor ELSE t.created_by END,
                created_at = CASE WHEN e.type = 'TokenCreated' THEN e.occurred_at ELSE t.created_at END,
                revoked_at = CASE WHEN e.type = 'TokenRevoked' THEN e.occurred_at END,
                revoked_by = CASE WHEN e.type = 'TokenRevoked' THEN e.actor END,
                last_position = e.position,
                chain = e.hash
             WHERE t.id = e.stream_id AND t.version = e.version - 1;
            GET DIAGNOSTICS found_rows = ROW_COUNT;
            IF found_rows = 0 THEN
                RAISE EXCEPTION 'token event out of order: % version % of stream % does not follow its stream',
                    e.type, e.version, e.stream_id USING ERRCODE = 'unique_violation';
            END IF;
        END IF;
    END LOOP;
END $$;

-- Least privilege (issue 30): the processes' roles can neither read
-- token_secrets nor the server's keys, nor append token events. These
-- SECURITY DEFINER functions (run as the schema owner, search path pinned by
-- definitions/90_roles.sql) are all they get, and definitions/90_roles.sql says
-- which role may call which.

-- Whether `caller_secret` may create or revoke tokens: the schema owner's own
-- session (qforge token create), while no token was ever made (the API is
-- open to anyone then: the first token is made that way), or the secret of an
-- active admin token. The secret itself, not its digest: the digests that old
-- TokenCreated events carry must not be enough.
CREATE OR REPLACE FUNCTION token_admin_allowed(caller_secret text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT pg_has_role(session_user, current_user, 'MEMBER')
        OR coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user), false)
        OR NOT EXISTS (SELECT FROM tokens)
        OR EXISTS (SELECT FROM token_secrets s JOIN tokens t ON t.id = s.id
                    WHERE caller_secret IS NOT NULL
                      AND s.sha256 = encode(sha256(convert_to(caller_secret, 'UTF8')), 'hex')
                      AND t.status = 'active' AND t.scope = 'admin')
$$;

-- One token event (TokenCreated or TokenRevoked), chained to the head of its
-- stream, folded by tokens_fold() in the same statement, and the secret's
-- digest kept apart (a revoked token's digest is forgotten). The caller holds
-- the token's row lock (token_lock).
CREATE OR REPLACE FUNCTION token_write(caller_secret text, token_id uuid, token_version integer,
                                       event_type text, event_data jsonb, event_actor text,
                                       secret_sha256 text)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    appended bigint;
BEGIN
    IF NOT token_admin_allowed(caller_secret) THEN
        RAISE EXCEPTION 'creating or revoking tokens needs an admin token' USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF event_type NOT IN ('TokenCreated', 'TokenRevoked') OR event_data ? 'sha256' THEN
        RAISE EXCEPTION 'token_write writes TokenCreated or TokenRevoked, without a digest'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO events (stream_type, stream_id, version, type, schema_version, data, occurred_at, actor, hash)
    SELECT 'token', token_id, token_version, event_type, 1::smallint, event_data, a.at, event_actor,
           event_hash((SELECT t.chain FROM tokens t WHERE t.id = token_id AND token_version > 1),
                      'token', token_id, token_version, event_type, 1::smallint, event_data,
                      NULL, NULL, a.at, event_actor)
      FROM (SELECT now() AS at) a
    RETURNING position INTO appended;
    IF event_type = 'TokenCreated' THEN
        INSERT INTO token_secrets (id, sha256) VALUES (token_id, secret_sha256)
        ON CONFLICT (id) DO UPDATE SET sha256 = excluded.sha256, created_at = now();
    ELSE
        DELETE FROM token_secrets WHERE id = token_id;
    END IF;
    RETURN appended;
END $$;

-- Every request asks (no cache, so a revocation holds at once on every API
-- process): are tokens on at all (any token ever created, revoked ones
-- included: revoking the last token locks the API, it does not reopen it),
-- and which active token has this digest. Two index probes.
CREATE OR REPLACE FUNCTION token_check(secret_sha256 text)
RETURNS TABLE (enabled boolean, name text, scope text) LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT EXISTS (SELECT 1 FROM tokens), t.name, t.scope
      FROM (SELECT 1) one
      LEFT JOIN (token_secrets s JOIN tokens t ON t.id = s.id AND t.status = 'active')
             ON s.sha256 = secret_sha256
$$;

-- The stream tickets' signature: HMAC-SHA256 (RFC 2104) of `payload` with the
-- key in server_keys, which no process's role reads. Python's hmac.new(key,
-- payload, sha256) gives the same bytes (a test checks it).
CREATE OR REPLACE FUNCTION stream_ticket_mac(payload bytea) RETURNS bytea
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    key bytea;
    inner_pad bytea;
    outer_pad bytea;
BEGIN
    SELECT k.key INTO key FROM server_keys k WHERE k.name = 'stream_ticket';
    IF key IS NULL THEN
        RAISE EXCEPTION 'server key stream_ticket is missing: run qforge migrate';
    END IF;
    IF octet_length(key) > 64 THEN
        key := sha256(key);
    END IF;
    key := key || decode(repeat('00', 64 - octet_length(key)), 'hex');
    inner_pad := key;
    outer_pad := key;
    FOR i IN 0 .. 63 LOOP
        inner_pad := set_byte(inner_pad, i, get_byte(key, i) # 54);   -- 0x36
        outer_pad := set_byte(outer_pad, i, get_byte(key, i) # 92);   -- 0x5c
    END LOOP;
    RETURN sha256(outer_pad || sha256(inner_pad || payload));
END $$;

-- A token's row, locked for the rest of the caller's transaction (a row lock
-- belongs to the transaction, not to this function), for token_write().
CREATE OR REPLACE FUNCTION token_lock(token_name text)
RETURNS TABLE (id uuid, version integer, name text, scope text, status text)
LANGUAGE sql SECURITY DEFINER AS $$
    SELECT t.id, t.version, t.name, t.scope, t.status FROM tokens t WHERE t.name = token_name FOR UPDATE
$$;
