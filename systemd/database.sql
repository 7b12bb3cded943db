-- PostgreSQL roles and database for the pipeline, on a server on the same host that
-- authenticates local connections by peer (the OS user name; Debian's default). Run once:
--   sudo -u postgres psql -v ON_ERROR_STOP=1 < systemd/database.sql
CREATE ROLE "clicks-collector" LOGIN;
CREATE ROLE "clicks-redirector" LOGIN;
-- The collector owns the database: its migrations create the tables at start.
CREATE DATABASE clicks OWNER "clicks-collector";
\connect clicks
-- The redirector only reads links and its change log, link_changes (and LISTENs, which needs
-- no grant). Roles that change links need no grant on the log: its triggers write it as the
-- collector.
ALTER DEFAULT PRIVILEGES FOR ROLE "clicks-collector" IN SCHEMA public
    GRANT SELECT ON TABLES TO "clicks-redirector";
