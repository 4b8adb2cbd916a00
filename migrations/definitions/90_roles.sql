-- Who may do what (issue 30: least privilege). THE ONE PLACE to edit when a
-- table, an event type or a SECURITY DEFINER function is added: the three
-- VALUES lists below. tests/test_roles.py fails while a table of the schema or
-- an event type of qforge.events.types is in none of them.
--
-- Each process connects as a login role of its own: <prefix>_api,
-- <prefix>_worker, <prefix>_monitor and <prefix>_read (prefix: the setting
-- QFORGE_ROLE_PREFIX, default `qforge`; qforge.migrate passes it to
-- roles_apply()). The schema owner is whoever runs `qforge migrate`. Roles are
-- cluster-wide, privileges are per database: every database migrated with the
-- same prefix grants to the same roles (the tests' per-test copies of one
-- template share them), and two installations on one server that must not
-- reach each other's data take different prefixes.
--
-- The guarantees (contract §7):
-- - the log: a role appends only the event types of its own commands (row-level
--   security on `events`, policy <kind>_append: a refused row fails with
--   SQLSTATE 42501); nobody updates or deletes events (10_log.sql);
-- - tokens: no role appends a token event, reads `token_secrets` or
--   `server_keys`, or locks `tokens`; token_write(), token_check(),
--   token_lock() and stream_ticket_mac() (SECURITY DEFINER, 70_tokens.sql) are
--   all they get;
-- - no role is a superuser or may create roles or databases, or bypass
--   row-level security;
-- - the read model: the roles whose commands fold into a table may write it
--   (the fold runs as the appender); `qforge replay --verify` finds any row
--   that differs from the log.

CREATE TABLE IF NOT EXISTS role_table_privileges (
    kind       text NOT NULL CHECK (kind IN ('api', 'worker', 'monitor', 'read')),
    object     text NOT NULL,   -- a table of this schema, '*' for every table not in role_private_tables
    privileges text NOT NULL,   -- as GRANT spells them: 'SELECT, INSERT, UPDATE'
    PRIMARY KEY (kind, object)
);
CREATE TABLE IF NOT EXISTS role_private_tables (
    object text PRIMARY KEY,    -- no role but the ones named in role_table_privileges reads it
    why    text NOT NULL
);
CREATE TABLE IF NOT EXISTS role_event_types (
    kind text NOT NULL CHECK (kind IN ('api', 'worker', 'monitor', 'owner')),  -- owner: through a function only
    type text NOT NULL,
    PRIMARY KEY (kind, type)
);
CREATE TABLE IF NOT EXISTS role_functions (
    kind     text NOT NULL CHECK (kind IN ('api', 'worker', 'monitor', 'read')),
    function text NOT NULL,     -- regprocedure: name(argument types)
    PRIMARY KEY (kind, function)
);

DELETE FROM role_private_tables;
INSERT INTO role_private_tables (object, why) VALUES
    ('token_secrets', 'digests of the API tokens'),
    ('server_keys', 'the stream-ticket key'),
    ('tokens', 'names and scopes: the API lists them (admins), nobody else needs them');

-- Fold tables: written by the fold of whichever events the role appends.
DELETE FROM role_table_privileges;
INSERT INTO role_table_privileges (kind, object, privileges) VALUES
    -- every role reads the rest of the schema
    ('read', '*', 'SELECT'), ('api', '*', 'SELECT'), ('worker', '*', 'SELECT'), ('monitor', '*', 'SELECT'),
    ('read', 'tokens', 'SELECT'), ('api', 'tokens', 'SELECT'),
    -- stream_head() names every stream table: the chain's head, not the names
    ('worker', 'tokens', 'SELECT (id, chain)'), ('monitor', 'tokens', 'SELECT (id, chain)'),
    -- the log: appends, filtered by type (role_event_types)
    ('api', 'events', 'INSERT'), ('worker', 'events', 'INSERT'), ('monitor', 'events', 'INSERT'),
    -- what the fold of their events writes (30_fold, 35_counters, 60_definitions, 65_flow)
    ('api', 'jobs', 'INSERT, UPDATE'), ('worker', 'jobs', 'INSERT, UPDATE'), ('monitor', 'jobs', 'INSERT, UPDATE, DELETE'),
    ('api', 'workflows', 'INSERT, UPDATE'), ('worker', 'workflows', 'INSERT, UPDATE'),
    ('monitor', 'workflows', 'INSERT, UPDATE, DELETE'),
    ('api', 'execution_tags', 'INSERT'), ('worker', 'execution_tags', 'INSERT'),
    ('monitor', 'execution_tags', 'INSERT, DELETE'),
    ('api', 'idempotency_keys', 'INSERT, DELETE'), ('worker', 'idempotency_keys', 'INSERT, DELETE'),
    ('monitor', 'idempotency_keys', 'INSERT, DELETE'),
    ('api', 'queue_count_deltas', 'INSERT'), ('worker', 'queue_count_deltas', 'INSERT'),
    ('monitor', 'queue_count_deltas', 'INSERT, DELETE'),
    ('monitor', 'queue_counts', 'INSERT, UPDATE'),
    ('api', 'concurrency_slots', 'INSERT, UPDATE'), ('worker', 'concurrency_slots', 'INSERT, UPDATE'),
    ('monitor', 'concurrency_slots', 'INSERT, UPDATE, DELETE'),
    ('api', 'concurrency_releases', 'INSERT'), ('worker', 'concurrency_releases', 'INSERT'),
    ('monitor', 'concurrency_releases', 'INSERT, DELETE'),
    ('api', 'queue_buckets', 'INSERT, UPDATE'), ('worker', 'queue_buckets', 'UPDATE'),
    ('monitor', 'queue_buckets', 'UPDATE'),
    ('api', 'queue_settings', 'INSERT, UPDATE'),
    ('api', 'schedules', 'INSERT, UPDATE, DELETE'), ('monitor', 'schedules', 'UPDATE'),
    ('api', 'definitions', 'INSERT, UPDATE'), ('api', 'definition_versions', 'INSERT'),
    -- per-key limits (KeyConfigured, 65_flow) and what the claim keeps of them
    ('api', 'key_settings', 'INSERT, UPDATE'), ('api', 'key_buckets', 'INSERT, UPDATE, DELETE'),
    ('worker', 'key_buckets', 'UPDATE'), ('worker', 'fairness_turns', 'INSERT, UPDATE'),
    -- who waits for work (34_wake.sql): workers add themselves, whoever makes work takes them
    ('api', 'job_waiters', 'UPDATE, DELETE'), ('worker', 'job_waiters', 'INSERT, UPDATE, DELETE'),
    ('monitor', 'job_waiters', 'UPDATE, DELETE'),
    -- the workers' own registry (heartbeats, /workers)
    ('worker', 'workers', 'INSERT, UPDATE, DELETE'), ('monitor', 'workers', 'UPDATE, DELETE'),
    -- the monitor's leader: audit checkpoints, packing and archiving the log
    ('monitor', 'audit_checkpoints', 'INSERT'),
    ('monitor', 'log_packs', 'INSERT, UPDATE, DELETE'),
    ('monitor', 'archive_segments', 'INSERT, UPDATE');

-- The event types each role may append (any other: 42501). Token events are
-- the owner's alone, written by token_write().
DELETE FROM role_event_types;
INSERT INTO role_event_types (kind, type)
SELECT 'api', unnest(ARRAY[
    'Enqueued', 'StepUnblocked', 'Skipped', 'Cancelled', 'Retried', 'DeadLettered', 'StepReopened', 'Triggered',
    'WorkflowSubmitted', 'WorkflowSucceeded', 'WorkflowFailed', 'WorkflowCancelled', 'WorkflowResumed',
    'ScheduleCreated', 'ScheduleUpdated', 'SchedulePaused', 'ScheduleResumed', 'ScheduleDeleted',
    'QueueConfigured', 'QueuePaused', 'QueueResumed', 'DefinitionStored', 'KeyConfigured'])
UNION ALL
SELECT 'worker', unnest(ARRAY[
    'Enqueued', 'StepUnblocked', 'Skipped', 'Claimed', 'Heartbeat', 'Succeeded', 'Failed', 'Retried',
    'DeadLettered', 'Released', 'Cancelled', 'Triggered',
    'WorkflowSubmitted', 'WorkflowSucceeded', 'WorkflowFailed', 'WorkflowCancelled'])
UNION ALL
SELECT 'monitor', unnest(ARRAY[
    'Enqueued', 'StepUnblocked', 'Skipped', 'Succeeded', 'Failed', 'Retried', 'DeadLettered', 'Released', 'Cancelled',
    'Triggered', 'WorkflowSubmitted', 'WorkflowSucceeded', 'WorkflowFailed', 'WorkflowCancelled',
    'ScheduleFired', 'ScheduleSkipped'])
UNION ALL
SELECT 'owner', unnest(ARRAY['TokenCreated', 'TokenRevoked']);

-- SECURITY DEFINER functions (run as the schema owner, search path pinned) and
-- who may call them; every other function of the schema is callable by all,
-- as PostgreSQL has it, and runs with the caller's own privileges.
DELETE FROM role_functions;
INSERT INTO role_functions (kind, function) VALUES
    ('api', 'token_check(text)'), ('read', 'token_check(text)'),
    ('api', 'token_lock(text)'),
    ('api', 'token_write(text,uuid,integer,text,jsonb,text,text)'),
    ('api', 'stream_ticket_mac(bytea)'), ('read', 'stream_ticket_mac(bytea)'),
    -- new jobs handed to idle workers: Claimed, appended for the roles that enqueue (34_wake.sql)
    ('api', 'jobs_hand(text,uuid[])'), ('worker', 'jobs_hand(text,uuid[])'), ('monitor', 'jobs_hand(text,uuid[])'),
    -- the log's partitions: DDL, which only the owner of the log may run
    ('monitor', 'log_maintain()'), ('api', 'log_maintain()'), ('worker', 'log_maintain()'),
    ('monitor', 'log_close_current()'), ('monitor', 'log_settle_lock()'), ('monitor', 'log_archive_let_go(bigint)'),
    ('monitor', 'log_pack_begin(bigint)'), ('monitor', 'log_pack_fill(bigint,bigint)'),
    ('monitor', 'log_pack_finish(bigint,bigint)'), ('monitor', 'log_pack_make_index(bigint,text)');

-- The role a kind of process logs in as.
CREATE OR REPLACE FUNCTION role_name(prefix text, kind text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT prefix || '_' || kind
$$;

-- Create the roles that are missing and give each exactly the privileges
-- above, in this database. Idempotent; run by every `qforge migrate` (inside
-- its transaction, after the files). Two migrations of two databases at once
-- may both try to create a role: the loser's error is caught. A schema owner
-- that may not create roles gets a warning: an administrator creates them
-- (docs/security.md), and the grants are made to the ones that exist.
CREATE OR REPLACE FUNCTION roles_apply(prefix text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    kinds constant text[] := ARRAY['api', 'worker', 'monitor', 'read'];
    schema_name constant text := current_schema();
    k text;
    role text;
    r record;
    types text[];
BEGIN
    IF prefix !~ '^[a-z][a-z0-9_]{0,40}$' THEN
        RAISE EXCEPTION 'role prefix % is not allowed: lower case letters, digits and _, starting with a letter',
            prefix USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- nobody creates objects in the schema but its owner (PostgreSQL 15's default)
    EXECUTE format('REVOKE CREATE ON SCHEMA %I FROM PUBLIC', schema_name);
    FOREACH k IN ARRAY kinds LOOP
        role := role_name(prefix, k);
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION'
                               ' NOBYPASSRLS', role);
                RETURN NEXT role;
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN NULL;  -- another migration made it just now
                WHEN insufficient_privilege THEN
                    RAISE WARNING 'role % does not exist and % may not create roles: ask an administrator'
                                  ' (docs/security.md)', role, current_user;
                    CONTINUE;
            END;
        ELSIF EXISTS (SELECT FROM pg_roles WHERE rolname = role
                         AND (rolsuper OR rolcreaterole OR rolcreatedb OR rolbypassrls OR rolreplication)) THEN
            EXECUTE format('ALTER ROLE %I NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS', role);
        END IF;
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', schema_name, role);
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA %I FROM %I', schema_name, role);
        EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA %I FROM %I', schema_name, role);
        -- tables made later by the owner (the log's partitions, packed blocks) can be read
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I GRANT SELECT ON TABLES TO %I', schema_name, role);
        FOR r IN SELECT p.object, p.privileges FROM role_table_privileges p WHERE p.kind = k LOOP
            IF r.object = '*' THEN
                PERFORM qforge_grant_all_tables(schema_name, role, r.privileges);
            ELSE
                EXECUTE format('GRANT %s ON TABLE %I.%I TO %I', r.privileges, schema_name, r.object, role);
            END IF;
        END LOOP;
        IF EXISTS (SELECT FROM role_table_privileges p WHERE p.kind = k AND p.object = 'events') THEN
            EXECUTE format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA %I TO %I', schema_name, role);
        END IF;
        IF true THEN  -- where the log's next position is (log_next_position)
            EXECUTE format('GRANT SELECT ON ALL SEQUENCES IN SCHEMA %I TO %I', schema_name, role);
        END IF;
    END LOOP;

    -- The log: who appends which types. Only what differs is made again: ENABLE and
    -- CREATE/DROP POLICY take ACCESS EXCLUSIVE on events, which would stop every append
    -- (and wait behind every long read) at each `qforge migrate` or `qforge api` start.
    IF NOT (SELECT relrowsecurity FROM pg_class WHERE oid = 'events'::regclass) THEN
        EXECUTE 'ALTER TABLE events ENABLE ROW LEVEL SECURITY';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_policies WHERE schemaname = schema_name AND tablename = 'events'
                      AND policyname = 'everyone_reads' AND cmd = 'SELECT' AND qual = 'true') THEN
        EXECUTE 'DROP POLICY IF EXISTS everyone_reads ON events';
        EXECUTE 'CREATE POLICY everyone_reads ON events FOR SELECT USING (true)';
    END IF;
    FOREACH k IN ARRAY ARRAY['api', 'worker', 'monitor'] LOOP
        role := role_name(prefix, k);
        CONTINUE WHEN NOT EXISTS (SELECT FROM pg_roles WHERE rolname = role);
        SELECT array_agg(t.type ORDER BY t.type) INTO types FROM role_event_types t WHERE t.kind = k;
        CONTINUE WHEN EXISTS (
            SELECT FROM pg_policy p
             WHERE p.polrelid = 'events'::regclass AND p.polname = k || '_append' AND p.polcmd = 'a'
               AND p.polroles = ARRAY[role::regrole::oid]
               AND pg_get_expr(p.polwithcheck, p.polrelid)
                   = format('(type = ANY (%L::text[]))', coalesce(types, '{}')));
        EXECUTE format('DROP POLICY IF EXISTS %I ON events', k || '_append');
        EXECUTE format('CREATE POLICY %I ON events FOR INSERT TO %I WITH CHECK (type = ANY (%L::text[]))',
                       k || '_append', role, coalesce(types, '{}'));
    END LOOP;

    -- The functions that run as the owner: callable only by the roles named.
    FOR r IN SELECT DISTINCT f.function FROM role_functions f LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp',
                       r.function::regprocedure, schema_name);
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', r.function::regprocedure);
    END LOOP;
    FOR r IN SELECT f.kind, f.function FROM role_functions f LOOP
        role := role_name(prefix, r.kind);
        CONTINUE WHEN NOT EXISTS (SELECT FROM pg_roles WHERE rolname = role);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', r.function::regprocedure, role);
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION qforge_grant_all_tables(schema_name text, role text, privileges text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT c.relname FROM pg_class c
              WHERE c.relnamespace = schema_name::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
                AND c.relname NOT IN (SELECT object FROM role_private_tables) LOOP
        EXECUTE format('GRANT %s ON TABLE %I.%I TO %I', privileges, schema_name, t.relname, role);
    END LOOP;
END $$;
