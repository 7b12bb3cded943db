-- Links the redirector serves, and the click tables the collector writes.
CREATE TABLE links (
    code       text PRIMARY KEY CHECK (code ~ '^[A-Za-z0-9_-]{1,64}$'),
    url        text NOT NULL CHECK (url ~ '^https?://'),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Every recorded click. Append-only and unindexed so binary COPY runs at full speed.
CREATE TABLE clicks (
    code       text NOT NULL,
    clicked_at timestamptz NOT NULL
);

-- Folded totals per code and UTC day, written only by the compaction task.
CREATE TABLE click_counts (
    code   text NOT NULL,
    day    date NOT NULL,
    clicks bigint NOT NULL,
    PRIMARY KEY (code, day)
);

-- Per-batch counts, appended in the batch's transaction and folded into click_counts later.
CREATE TABLE click_count_deltas (
    code   text NOT NULL,
    day    date NOT NULL,
    clicks bigint NOT NULL
);

-- Exact totals at any moment: what is folded plus what is not yet.
CREATE VIEW click_totals AS
SELECT code, day, sum(clicks)::bigint AS clicks
FROM (
    SELECT code, day, clicks FROM click_counts
    UNION ALL
    SELECT code, day, clicks FROM click_count_deltas
) AS parts
GROUP BY code, day;

-- The last datagram committed per redirector process, for duplicate and gap detection.
CREATE TABLE click_senders (
    sender     bigint PRIMARY KEY,
    last_seq   bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Redirectors LISTEN on links_changed and reload their link table when it fires.
CREATE FUNCTION notify_links_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('links_changed', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER links_changed
AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON links
FOR EACH STATEMENT EXECUTE FUNCTION notify_links_changed();
