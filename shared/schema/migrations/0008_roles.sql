-- One role per process, each with only what it needs (NOLOGIN group roles: the login roles
-- the services connect as are made members, e.g. by systemd/database.sql).
--
-- clicks_collector owns the schema. That is not more than the running collector needs:
-- partition maintenance (CREATE TABLE ... PARTITION OF clicks, DETACH PARTITION, DROP,
-- CREATE INDEX on a partition) is allowed to the owner of clicks only, and PostgreSQL has no
-- privilege to grant for it instead. The collector also applies these migrations at start,
-- as the same role. What it does not get: superuser, CREATEROLE, CREATEDB, or anything
-- outside this database.
--
-- clicks_link_reader (the redirector): SELECT on links and its change log, nothing else;
-- LISTEN needs no grant. It cannot read clicks or any count.
--
-- Roles belong to the cluster, not the database: created only if missing (by a role that
-- can; systemd/database.sql creates them beforehand for a collector that cannot). Two
-- databases of one cluster migrating at once race to create them: the loser's unique
-- violation is caught.
DO $$
DECLARE
    role text;
BEGIN
    FOREACH role IN ARRAY ARRAY['clicks_collector', 'clicks_link_reader'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', role);
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN NULL;
                WHEN insufficient_privilege THEN
                    RAISE EXCEPTION 'migration 8: role % is missing, and % may not create it',
                        role, current_user
                        USING HINT = 'As a superuser, create the roles and make the services'' '
                                     'login roles members (docs/operating.md, "Database access").';
            END;
        END IF;
    END LOOP;
END
$$;

-- Handing the schema to clicks_collector needs the migrating role to be a member of it (a
-- superuser is). A collector upgraded from before this migration, under the roles of an
-- older systemd/database.sql, is not: say what to run rather than fail obscurely.
DO $$
BEGIN
    IF NOT pg_has_role(current_user, 'clicks_collector', 'MEMBER') THEN
        RAISE EXCEPTION 'migration 8: role % is not a member of clicks_collector', current_user
            USING HINT = format('As a superuser, run: GRANT clicks_collector TO %I; '
                                'GRANT clicks_link_reader TO <the redirector''s role>; '
                                'then, on a database set up with an older database.sql, the '
                                'REVOKEs of docs/operating.md, "Upgrading a database set up '
                                'before migration 8"; then start the collector again.',
                                current_user);
    END IF;
END
$$;

-- Creating tables (partitions, later migrations) in the schema.
GRANT USAGE, CREATE ON SCHEMA public TO clicks_collector;

-- Everything the migrations made so far (tables, partitions, views, sequences, functions)
-- passes to clicks_collector, so that any member can run the collector and later migrations.
-- Not what an extension made (pg_stat_statements' view, pgcrypto's functions): its owner is
-- the superuser who created it, which a collector may not take from it, nor should.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT c.oid::regclass AS name, c.relkind
        FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace
          AND c.relkind IN ('r', 'p', 'v', 'm')
          AND c.relowner <> 'clicks_collector'::regrole
          AND NOT EXISTS (SELECT FROM pg_depend d
                          WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                            AND d.deptype = 'e')
    LOOP
        EXECUTE format('ALTER TABLE %s OWNER TO clicks_collector', r.name);
    END LOOP;
    FOR r IN
        SELECT p.oid::regprocedure AS name
        FROM pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace
          AND p.proowner <> 'clicks_collector'::regrole
          AND NOT EXISTS (SELECT FROM pg_depend d
                          WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                            AND d.deptype = 'e')
    LOOP
        -- A routine: a procedure or an aggregate too.
        EXECUTE format('ALTER ROUTINE %s OWNER TO clicks_collector', r.name);
    END LOOP;
END
$$;

-- A partition created later belongs to clicks_collector too, not to whichever member's login
-- created it, so that any member can drop it when retention comes (migration 6's function,
-- plus the ALTER ... OWNER).
CREATE OR REPLACE FUNCTION ensure_click_partition(day date) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    name  text := 'clicks_p' || to_char(day, 'YYYYMMDD');
    lower timestamptz := (day::timestamp AT TIME ZONE 'UTC');
    upper timestamptz := ((day + 1)::timestamp AT TIME ZONE 'UTC');
    start timestamptz := (SELECT p.start FROM click_partitions_start AS p);
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('clicks partitions', 0));
    IF to_regclass(name) IS NOT NULL OR upper <= start THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF clicks FOR VALUES FROM (%L) TO (%L)',
                   name, greatest(lower, start), upper);
    EXECUTE format('ALTER TABLE %I OWNER TO clicks_collector', name);
    RETURN true;
END
$$;

GRANT USAGE ON SCHEMA public TO clicks_link_reader;
GRANT SELECT ON links, link_changes, link_changes_state TO clicks_link_reader;
