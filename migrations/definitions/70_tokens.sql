-- The fold of token events into `tokens` (issue 19). Its own statement
-- trigger on events, so replay's feed table carries it too (replay copies
-- every statement trigger with a transition table) and, with the scratch
-- schema first on the search path, rebuilds `tokens` like the other
-- projections. Token events are rare (an operator's command): row by row is
-- plenty, and the state machine ('token' in qforge.events.states) guards each.
CREATE OR REPLACE FUNCTION tokens_project() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    e record;
    found_rows bigint;
BEGIN
    FOR e IN SELECT * FROM new_token_events x WHERE x.stream_type = 'token' ORDER BY x.position LOOP
        IF e.type = 'TokenCreated' AND e.version = 1 THEN
            PERFORM coalesce(state_target('token', NULL, e.type, NULL),
                             state_refuse('token', NULL, e.type, NULL, e.stream_id));
            INSERT INTO tokens (id, version, name, scope, sha256, status, created_by, created_at,
                                last_position, chain)
            VALUES (e.stream_id, e.version, e.data ->> 'name', e.data ->> 'scope', e.data ->> 'sha256',
                    state_target('token', NULL, e.type, NULL), e.actor, e.occurred_at, e.position, e.hash);
        ELSE
            UPDATE tokens t SET
                version = e.version,
                status = coalesce(state_target('token', t.status, e.type, NULL),
                                  state_refuse('token', t.status, e.type, NULL, e.stream_id)),
                -- created again after a revocation: a new secret, maybe a new scope
                scope = CASE WHEN e.type = 'TokenCreated' THEN e.data ->> 'scope' ELSE t.scope END,
                sha256 = CASE WHEN e.type = 'TokenCreated' THEN e.data ->> 'sha256' ELSE t.sha256 END,
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
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER tokens_project AFTER INSERT ON events
    REFERENCING NEW TABLE AS new_token_events
    FOR EACH STATEMENT EXECUTE FUNCTION tokens_project();
