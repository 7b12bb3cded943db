-- What a resync needs, and whose senders are whose.
--
-- clicks: the clicks in a sender's datagrams up to last_seq, since its seq 0. When a sender
-- resyncs (the collector asked for a seq it no longer holds: this row was lost or rolled back),
-- it reports how many clicks were acknowledged before the first seq it holds; the difference
-- with this column is what the collector counts as unaccounted. Rows from before this
-- migration start at 0, so a resync of one of them counts every click before it.
--
-- instance: the instance (--instance) of the collector that judges the sender. A collector
-- deletes, when it forgets idle ids, only its own instance's rows (and rows from before this
-- migration), so that on a database several hosts share, one collector's sweep of idle ids
-- never deletes another host's live rows.
ALTER TABLE click_senders
    ADD COLUMN clicks bigint NOT NULL DEFAULT 0,
    ADD COLUMN instance text;
