-- Several collectors (one per host) write to one database at once: each writer's row says which
-- collector instance it belongs to, so an operator can see who writes:
--   SELECT instance, writer, last_batch, updated_at FROM click_writers ORDER BY updated_at DESC;
-- Rows written before this migration have no instance.
ALTER TABLE click_writers ADD COLUMN instance text;
