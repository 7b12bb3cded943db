-- PostgreSQL roles and database for the pipeline, on a server on the same host that
-- authenticates local connections by peer (the OS user name; Debian's default). Run once:
--   sudo -u postgres psql -v ON_ERROR_STOP=1 < systemd/database.sql
--
-- Two group roles hold the privileges (migration 8 grants them; it creates them too when the
-- collector may, which it may not here), and one login role per service is a member:
--   clicks_collector   owns the schema: the collector applies the migrations at start and
--                      manages clicks' partitions, which only the owner may do.
--   clicks_link_reader SELECT on links and its change log; LISTEN. Nothing else: it cannot
--                      read clicks.
-- (\gexec: created only if missing, as migration 8 may have on this server already.)
SELECT 'CREATE ROLE clicks_collector NOLOGIN'
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'clicks_collector') \gexec
SELECT 'CREATE ROLE clicks_link_reader NOLOGIN'
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'clicks_link_reader') \gexec
CREATE ROLE "clicks-collector" LOGIN IN ROLE clicks_collector;
CREATE ROLE "clicks-redirector" LOGIN IN ROLE clicks_link_reader;
-- The collector's login role owns the database, so that it can create the schema's tables
-- (and hand them to clicks_collector) in its first migrations.
CREATE DATABASE clicks OWNER "clicks-collector";
-- The group roles are the server's, not this database's: the logins of another pipeline on
-- this server (a staging one beside production) are members too, and would own and read this
-- one's tables. Only this pipeline's logins connect here: grant CONNECT to any other role
-- that must (the application writing links, a subscription's owner, reports, backups).
REVOKE CONNECT ON DATABASE clicks FROM PUBLIC;
GRANT CONNECT ON DATABASE clicks TO "clicks-collector", "clicks-redirector";
-- In the new database, schema public takes objects from the collector's group role (its
-- migrations and daily partitions) and from nobody else. Before PostgreSQL 15 every role may
-- create objects in public, and so shadow a function the collector calls by name; migration
-- 13 stops on such a schema (15 and later have this by default: then only the GRANT counts).
\connect clicks
GRANT USAGE, CREATE ON SCHEMA public TO clicks_collector;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
