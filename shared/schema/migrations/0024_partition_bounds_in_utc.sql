-- A day's partition bounds are written into its CREATE TABLE as text (format's %L), which
-- renders a time as the session's DateStyle and TimeZone have it. Under 'SQL' or 'Postgres'
-- with a zone whose abbreviation PostgreSQL reads as another zone's (Dublin's summer time,
-- 'IST', read as Israel's), every day was created an hour off, and the last hour's clicks of
-- each were refused by the partition named for their day. The function now renders in ISO,
-- in UTC, whatever the session's settings. Days created before keep their bounds.
ALTER FUNCTION ensure_click_partition(date) SET DateStyle = 'ISO, YMD';
ALTER FUNCTION ensure_click_partition(date) SET TimeZone = 'UTC';
