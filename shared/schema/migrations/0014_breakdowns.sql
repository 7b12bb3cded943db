-- What shortener operators expect of a link and of its clicks.
--
-- Per link: whether the request's query string is forwarded into the target (on by default),
-- the redirect status (302 by default; 301, 307 or 308), and when it expires (NULL: never;
-- after it the redirector answers 410 Gone and records no click). Adding columns with
-- constant defaults rewrites nothing; the CHECK reads the table once, under this
-- migration's lock. The statement triggers of migration 4 log every updated code, so a
-- change of any of these is served within a second like a change of the URL.
ALTER TABLE links
    ADD COLUMN forward_query boolean NOT NULL DEFAULT true,
    ADD COLUMN status smallint NOT NULL DEFAULT 302
        CONSTRAINT links_status_redirect CHECK (status IN (301, 302, 307, 308)),
    ADD COLUMN expires_at timestamptz;

-- Per click, coarse dimensions counted per code and UTC day, never a row per click: the agent
-- (human, bot, preview; unknown for a redirector from before this version) always, and the
-- referrer's host, the device class and the country when the redirector records them
-- (--dimensions). No address and no user agent is kept anywhere.
--
-- Kept as the totals are: each batch appends its counts as lists, one row per (day,
-- dimension), in its own transaction; the collector's fold moves them into
-- click_breakdown_counts; the view adds both, exact at every moment. The agent `human` is not
-- stored: the view derives it from click_totals.
CREATE TABLE click_breakdown_counts (
    code      text   NOT NULL,
    day       date   NOT NULL,
    dimension text   NOT NULL
        CONSTRAINT click_breakdown_dimension CHECK (dimension IN ('agent', 'referrer', 'device', 'country')),
    value     text   NOT NULL,
    clicks    bigint NOT NULL,
    PRIMARY KEY (code, day, dimension, value)
);
-- Retention deletes by day.
CREATE INDEX click_breakdown_counts_day ON click_breakdown_counts (day);

-- Codes are [A-Za-z0-9_-] and values [a-z0-9._-], a country's two letters or a parenthesised
-- word: a space never occurs in either.
CREATE TABLE click_breakdown_lists (
    day        date    NOT NULL,
    dimension  text    NOT NULL,
    entries    integer NOT NULL,
    code_list  text    NOT NULL,
    value_list text    NOT NULL,
    count_list text    NOT NULL,
    writer     bigint  NOT NULL,
    batch      bigint  NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE click_breakdown_lists
    ALTER COLUMN code_list SET STORAGE EXTERNAL,
    ALTER COLUMN value_list SET STORAGE EXTERNAL,
    ALTER COLUMN count_list SET STORAGE EXTERNAL;
ALTER TABLE click_breakdown_counts OWNER TO clicks_collector;
ALTER TABLE click_breakdown_lists OWNER TO clicks_collector;

-- What the two tables hold, summed. Not the agent `human`: most clicks are a person's, and a
-- row per (code, day, human) in every batch's lists and every fold cost PostgreSQL as much
-- again as the totals themselves; it is derived below from click_totals instead.
CREATE VIEW click_breakdown_stored AS
SELECT code, day, dimension, value, sum(clicks)::bigint AS clicks
FROM (
    SELECT code, day, dimension, value, clicks FROM click_breakdown_counts
    UNION ALL
    SELECT u.code, l.day, l.dimension, u.value, u.clicks
    FROM click_breakdown_lists AS l,
         unnest(string_to_array(l.code_list, ' '), string_to_array(l.value_list, ' '),
                string_to_array(l.count_list, ' ')::bigint[]) AS u(code, value, clicks)
) AS parts
WHERE NOT (dimension = 'agent' AND value = 'human')
GROUP BY code, day, dimension, value;

-- Every click has an agent: the humans of a (code, day) are its total less its other agents.
-- Retention keeps the agent rows (as click_counts keeps the totals), so this holds for every
-- day.
CREATE VIEW click_breakdown AS
SELECT code, day, dimension, value, clicks FROM click_breakdown_stored
UNION ALL
SELECT t.code, t.day, 'agent', 'human', t.clicks - coalesce(o.clicks, 0)
FROM click_totals AS t
LEFT JOIN (SELECT code, day, sum(clicks)::bigint AS clicks FROM click_breakdown_stored
           WHERE dimension = 'agent' GROUP BY code, day) AS o USING (code, day)
WHERE t.clicks > coalesce(o.clicks, 0);
ALTER VIEW click_breakdown_stored OWNER TO clicks_collector;
ALTER VIEW click_breakdown OWNER TO clicks_collector;
