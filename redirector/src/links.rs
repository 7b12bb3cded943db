//! The link table and the task that keeps it equal to `links`.
//!
//! Requests read a [`Table`] without a lock or a wait. One loader, on a thread of its own (so
//! neither a load nor a change ever runs on a request worker), loads the whole table at start
//! and then applies the change log `link_changes` (migration 4) incrementally: on each
//! `links_changed` notification (a wake-up only) and every `--reload-interval`; while changes
//! keep coming it stops listening and reads every 100 ms instead. Each read is one snapshot: a
//! single prepared statement, one round trip, for a read of the log; a REPEATABLE READ
//! transaction for a full load. The position a read reached (highest id seen, transactions
//! then in progress, TRUNCATE epoch) outlives a lost session, so a new session resumes where
//! the last one stopped. A full load happens only at start and when the log cannot bring the
//! table up to date (pruned past our position, or `links` truncated); while serving it
//! compares instead of rebuilding, so memory does not double. A server on the same history
//! whose WAL is behind the last read applied (a lagging standby) is not read from until it
//! catches up. Every query has a client-side
//! timeout: a session that stops answering is dropped and replaced, and the last table keeps
//! serving.

mod apply;
mod standby;

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt};
use tokio::sync::{watch, Notify};
use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::{AsyncMessage, Client, IsolationLevel, Row, Statement, Transaction};

use crate::session::AbortOnDrop;
use crate::table::{usable, Table, Unusable};
use crate::target::{self, Answer, LinkOptions};
use apply::{Batch, Seen};
use shared::backoff::Backoff;
use shared::metrics::{Counter, FloatGauge, Gauge};

shared::metrics! {
    /// What the link loader counts: the table, its loads and changes, its sessions.
    pub struct Metrics {
        links: Gauge = "links", "Links being served.";
        link_loads: Counter = "link_loads",
            "Full loads of the link table (at start, or when the change log cannot catch up).";
        link_load_errors: Counter = "link_load_errors",
            "Link table sessions lost: failed or timed-out connections, loads or reads.";
        links_skipped: Gauge = "links_skipped", "Rows of links left out for a bad code or URL.";
        links_polling: Gauge = "links_polling",
            "1 while the link loader follows the change log by reading it without LISTEN \
             (every 100 ms while changes keep coming; every --reload-interval on a hot \
             standby, which cannot LISTEN), 0 while it LISTENs or is not connected.";
        link_changes_applied: Counter = "link_changes_applied",
            "Changed codes applied from the change log.";
        link_reads_behind: Counter = "link_reads_behind",
            "Reads of the change log that found the server behind the table already served \
             (a standby on the same history that has not replayed as far as the server last \
             read): nothing applied, the table served as it is until the server catches up.";
        /// For changes, seconds from the newest applied change's `changed_at` to its
        /// application; for a full load, its duration.
        links_lag: FloatGauge = "links_lag_seconds",
            "Seconds from the newest applied change's commit to its application (a full load: its duration).";
        /// The database's clock.
        links_synced: FloatGauge = "links_synced_timestamp_seconds",
            "Unix time of the last successful read of the change log (0: none yet); from a hot \
             standby behind on replaying what it received, as current as what it replayed.";
    }
}

/// How many of a session's reads of a hot standby [`current_to`] looks back over: a
/// minute's at the default --reload-interval, as long as LinksStale waits.
const RECEIPTS: usize = 64;

/// After a notification, wait this long for the rest of a burst of changes before reading; and,
/// while changes keep coming, read this often instead of listening.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// A read of the change log takes at most this many unread log rows (counted, not guessed from
/// ids: a bulk change may commit below ids already read); more (a bulk change, or `TRUNCATE`
/// and a reload) make a full load instead, which costs the table's size and cannot outlast
/// `--link-timeout` the way one statement grouping millions of rows could.
pub const LOG_READ_MAX: i64 = 100_000;
/// How many skipped rows a load names in the log; the rest are only counted.
const SKIPPED_LOGGED: usize = 5;
/// The `application_name` of the loader's sessions, to find them in `pg_stat_activity`.
pub const APPLICATION_NAME: &str = "redirector-links";

/// The table being served, and whether the first load finished.
pub struct LinkTable {
    table: Table,
    loaded: AtomicBool,
    loaded_tx: watch::Sender<bool>,
}

impl Default for LinkTable {
    fn default() -> Self {
        LinkTable {
            table: Table::default(),
            loaded: AtomicBool::new(false),
            loaded_tx: watch::Sender::new(false),
        }
    }
}

/// The answer for a code.
pub(crate) enum Lookup {
    Found(Answer),
    Unknown,
    /// No table loaded yet.
    NotLoaded,
}

impl LinkTable {
    /// The answer for `code` to a request with `query` (the part after `?`).
    pub(crate) fn lookup(&self, code: &str, query: Option<&str>) -> Lookup {
        if !self.is_loaded() {
            return Lookup::NotLoaded;
        }
        // A copy of the URL, not a reference into the shard's arena: measured cheaper once
        // the header is written (no shared reference count to touch; BENCHMARKS.md).
        match self.table.get_with(code.as_bytes(), |value| {
            Answer::of(value, query, protocol::now_us)
        }) {
            Some(Some(answer)) => Lookup::Found(answer),
            _ => Lookup::Unknown,
        }
    }

    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Resolves once the first table is in place.
    pub async fn wait_loaded(&self) {
        let mut rx = self.loaded_tx.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|loaded| *loaded).await;
    }

    fn set_loaded(&self) {
        self.loaded.store(true, Ordering::Release);
        self.loaded_tx.send_replace(true);
    }
}

/// How the loader talks to the database.
#[derive(Debug, Clone)]
pub struct Options {
    /// Read the change log this often even without a notification.
    pub poll: Duration,
    /// Connect timeout, statement timeout, and the longest any answer may take.
    pub timeout: Duration,
}

/// Starts the loader on a thread of its own, for as long as the process runs; the thread
/// holds `vital` until it ends.
pub fn spawn(
    config: shared::db::Config,
    links: Arc<LinkTable>,
    metrics: Arc<Metrics>,
    options: Options,
    vital: shared::vital::Vital,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let config = config.guarded(options.timeout, APPLICATION_NAME);
    std::thread::Builder::new()
        .name("link-loader".into())
        .spawn(move || {
            let _vital = vital;
            let mut loader = Loader::new(links, metrics, options);
            let _span = tracing::info_span!("links").entered();
            runtime.block_on(loader.run(&config));
        })?;
    Ok(())
}

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("database: {}", shared::db::describe(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("database connection closed")]
    Closed,
    #[error("no answer from the database within {0:?}; dropping the session")]
    Timeout(Duration),
    #[error("link_changes_state has no row: the schema is not as the migrations left it")]
    NoState,
    #[error(
        "the change log's tables were made again and links has no triggers yet (a restore in \
         progress, or the triggers dropped): the table is served as it was until they are \
         there, then loaded in full"
    )]
    Restoring,
    /// Not a failure: the hot standby the session polls was promoted, and a new session on it
    /// listens for changes instead.
    #[error("the hot standby was promoted")]
    Promoted,
}

/// What an incremental read did.
enum Read {
    /// Applied every change up to this head: this many codes.
    Applied(Head, u64),
    /// The server is a standby behind the table served (`Head::behind`): nothing applied.
    Lagging(Head),
    /// The server lacks changes the table applied, and will not catch up (`Head::lacks_applied`,
    /// or a primary behind on WAL): restored from a copy of its files, or crashed having lost
    /// what it committed asynchronously. Its ids may start again below the position's: load
    /// it all, from no position.
    Rewound,
    /// The log cannot bring the table up to date, for this reason: load it all.
    Behind(&'static str),
}

/// Where the loader is in the change log: every change with an id up to `last_id` is applied,
/// except those of the transactions `in_progress` at that read and of transactions from
/// `horizon` on (which that read's snapshot could not see, though some had taken lower ids);
/// and the TRUNCATE `epoch` the table was loaded under.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Position {
    last_id: i64,
    in_progress: Vec<i64>,
    horizon: i64,
    epoch: i64,
    /// `Head::log_table` at that read.
    log_table: i64,
    /// `Head::wal` at that read, or at a later one on the same history.
    wal: Option<i64>,
    /// Which change `last_id` was (`Head::top_change`), where a read saw it: a server whose
    /// change of that id is another, or gone though not pruned, lacks changes the table
    /// applied, whatever its WAL says (`Head::lacks_applied`). Its transaction and its time:
    /// after a restore, the same number of transactions may hand the same ids out again.
    last_change: Option<String>,
}

/// What one read of the change log's state says, in the read's snapshot.
#[derive(Debug)]
struct Head {
    epoch: i64,
    pruned_id: i64,
    pruned_xid: i64,
    /// The highest change id visible.
    top: i64,
    /// Transactions in progress (invisible) in this snapshot, below `horizon`.
    xip: Vec<i64>,
    /// The snapshot's horizon: transactions from this id on may be invisible to it, and are
    /// not in `xip` though they may be running. On a primary, the snapshot's xmax (PostgreSQL's
    /// is the latest completed id + 1). On a hot standby, its xmin: there a snapshot lists
    /// every running transaction as a subtransaction, which `pg_current_snapshot()` leaves
    /// out, so `xip` is empty and every transaction from the oldest running one on may be.
    horizon: i64,
    /// The database's clock at the read, Unix seconds.
    now: f64,
    /// Whether the server is a hot standby (in recovery).
    standby: bool,
    /// On a hot standby, how far it has received WAL (a position; `None` while no WAL receiver
    /// has streamed since it started: one restoring from an archive, or not connected yet)
    /// and how far it has replayed it.
    received: Option<i64>,
    replayed: Option<i64>,
    /// On a hot standby, the commit time of the last transaction it replayed (the primary's
    /// clock, Unix seconds); `None` if it replayed none since it started.
    replayed_at: Option<f64>,
    /// The oid of `link_changes_state`: another once the tables are made again (a
    /// `pg_restore --clean`, the database dropped and made anew), on the same server and
    /// timeline, where the log's ids and epoch may start again below those read.
    log_table: i64,
    /// Whether `links` has triggers: a restore makes them after every table's rows (with
    /// `pg_restore` not run as one transaction, each table's rows commit on their own), so
    /// until then a full load may find `links` empty or partly loaded, and the rest of its rows
    /// go unlogged.
    links_triggered: bool,
    /// How far the server's WAL goes, as a position: a primary's flush position, past every
    /// commit its snapshots see but those committed asynchronously and not flushed yet (its
    /// insert position, past them too, may be a page header past anything a standby can
    /// replay while the primary is idle); a hot standby's replay position, as far as its
    /// snapshots see. On one history (system identifier and timeline) a server below the
    /// position of a read already applied is behind it: what it says of `links` is older than
    /// the table served.
    wal: Option<i64>,
    /// Which change `top` is: its transaction and its time (none if the log is empty).
    top_change: Option<String>,
}

/// The change log's state in the reader's snapshot: the columns of [`Head`]. A macro, so that
/// [`HEAD`] and [`READ`] share one text.
macro_rules! head_columns {
    () => {
        "SELECT s.epoch, s.pruned_id, s.pruned_xid::text::bigint AS pruned_xid,
                coalesce((SELECT max(id) FROM link_changes), 0) AS top,
                ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(pg_current_snapshot()) AS x),
                CASE WHEN pg_is_in_recovery() THEN pg_snapshot_xmin(pg_current_snapshot())
                     ELSE pg_snapshot_xmax(pg_current_snapshot()) END::text::bigint,
                extract(epoch FROM clock_timestamp())::float8,
                pg_is_in_recovery(),
                pg_wal_lsn_diff(pg_last_wal_receive_lsn(), '0/0')::int8,
                pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')::int8,
                extract(epoch FROM pg_last_xact_replay_timestamp())::float8,
                s.tableoid::int8,
                EXISTS (SELECT FROM pg_trigger
                        WHERE tgrelid = 'links'::regclass AND NOT tgisinternal),
                pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                                     ELSE pg_current_wal_flush_lsn() END, '0/0')::int8,
                (SELECT xid::text || ' ' || (extract(epoch FROM changed_at) * 1e6)::int8
                   FROM link_changes ORDER BY id DESC LIMIT 1)
           FROM link_changes_state AS s"
    };
}

/// `Position::last_change` of a position whose last id is the log's pruned id, past its top:
/// no change of that id is left, nor may one come.
const PRUNED: &str = "pruned";

/// A link's columns, as [`link_of`] reads them: the URL, status, query forwarding and expiry
/// (Unix microseconds; `infinity` is the year 9999, `-infinity` the year 1).
macro_rules! link_columns {
    () => {
        "url, status, forward_query,
         CASE WHEN expires_at IS NOT NULL THEN (extract(epoch FROM
             least(greatest(expires_at, '0001-01-01Z'), '9999-12-31Z')) * 1000000)::int8 END"
    };
}

/// The link in `row`'s [`link_columns`] from column `at` on; `None` for a code with no row.
/// A column that does not decode (a type an operator changed) is an error of the read, never
/// a panic of the loader; a URL that is not UTF-8 (a `SQL_ASCII` database) is the row's
/// fault alone, and [`Loader::check`] skips that row.
fn link_of(row: &Row, at: usize) -> Result<Option<(&[u8], LinkOptions)>, tokio_postgres::Error> {
    let Some(TextBytes(url)) = row.try_get(at)? else {
        return Ok(None);
    };
    let options = LinkOptions {
        status: row.try_get(at + 1)?,
        forward_query: row.try_get(at + 2)?,
        expires_us: row.try_get(at + 3)?,
    };
    Ok(Some((url, options)))
}

/// A text column's bytes as the server sent them, not checked as UTF-8: a `SQL_ASCII`
/// database hands out whatever bytes were stored, and one such row must be skipped and
/// counted ([`Loader::check`]), not fail every read that meets it.
struct TextBytes<'a>(&'a [u8]);

impl<'a> FromSql<'a> for TextBytes<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(TextBytes(raw))
    }

    /// The types whose binary form is the text itself (not `ltree` and its kin, which `&str`
    /// also takes, after a version byte).
    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME)
            || ty.name() == "citext"
    }
}

/// How many columns [`head_columns`] has: [`READ`]'s count and change columns come after.
const HEAD_COLUMNS: usize = 15;

/// The head alone, for a full load: read in the load's snapshot.
const HEAD: &str = head_columns!();

/// The head; how many log rows are unread since a position ($1: the highest id applied, $2:
/// the transactions then in progress, $3: that read's horizon), counted up to $5 + 1 ($5:
/// [`LOG_READ_MAX`]), and which change $1 is now (`Head::top_change`); then each code they name with its current URL (NULL: gone), its newest
/// change's time and its highest change id. One statement, so one snapshot covers it all without a transaction, in one
/// round trip. Every row repeats the head and the count; a read with nothing new has one row,
/// whose code is NULL. The changes are not read at all when a full load is due (another epoch
/// than ours, $4; the log pruned past us; more than $5 rows): [`Loader::apply_changes`] says
/// so for each of these cases, so an empty read never passes for an up-to-date one.
const READ: &str = concat!(
    "WITH head AS MATERIALIZED (",
    head_columns!(),
    "),
    unread AS NOT MATERIALIZED (
        SELECT id, code, changed_at FROM link_changes
         WHERE id > $1 OR xid = ANY($2::bigint[]::text[]::xid8[])
            OR xid >= $3::bigint::text::xid8),
    pending AS MATERIALIZED (
        SELECT count(*) AS n,
               (SELECT xid::text || ' ' || (extract(epoch FROM changed_at) * 1e6)::int8
                  FROM link_changes WHERE id = $1) AS at_change
          FROM (SELECT 1 FROM unread LIMIT $5::bigint + 1) AS p)
    SELECT h.*, p.n, p.at_change, c.code, ",
    link_columns!(),
    ", extract(epoch FROM c.changed_at)::float8, c.id
      FROM head AS h CROSS JOIN pending AS p
      LEFT JOIN (SELECT code, max(changed_at) AS changed_at, max(id) AS id FROM unread
                  WHERE (SELECT epoch = $4 AND pruned_id <= $1 FROM head)
                    AND (SELECT n <= $5::bigint FROM pending)
                  GROUP BY code) AS c ON true
      LEFT JOIN links AS l USING (code)"
);

/// In a `SQL_ASCII` database only, rows as stored: no conversion, so no check either.
const SQL_ASCII_AS_STORED: &str = "SELECT set_config('client_encoding', 'SQL_ASCII', false)
                                    WHERE current_setting('server_encoding') = 'SQL_ASCII'";

const ALL_LINKS: &str = concat!("SELECT code, ", link_columns!(), " FROM links");
/// Whether this role may read the server's system identifier: a query calling
/// `pg_control_system()` fails without that right, whatever branch of it runs (a function's
/// right is checked when the query starts), so [`HISTORY`] is asked only where it may.
const HISTORY_VISIBLE: &str = "SELECT has_function_privilege('pg_control_system()', 'EXECUTE')";
/// The server's history: its cluster's system identifier and its timeline (in hexadecimal: a
/// primary's from the WAL file it writes, a standby's from its WAL receiver); NULL where the
/// timeline is hidden from this role or unknown.
const HISTORY: &str = "SELECT (SELECT system_identifier FROM pg_control_system())
                           || '/' ||
                           CASE WHEN pg_is_in_recovery()
                                THEN (SELECT lpad(upper(to_hex(received_tli)), 8, '0')
                                        FROM pg_stat_wal_receiver)
                                ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END";
const ALL_CODES: &str = "SELECT code FROM links";

/// How current the table is after a read at `head`: as the read's clock, unless the server is
/// a hot standby that received WAL it has not replayed (its replay paused, stuck or delayed),
/// whose snapshot is as old as its replay however fresh its clock. Then the latest of: the
/// last of this session's reads (`receipts`, to which this one is added) whose WAL received by
/// then it has replayed since; the commit time of the last transaction it replayed; and
/// `before`, how current the table was before this read, if the read left some of it as it
/// was (not a `full_load`). After a full load, `before` only if neither of the others is
/// known; none of these known (a first read): the read's clock.
fn current_to(
    receipts: &mut VecDeque<(f64, i64)>,
    head: &Head,
    before: Option<f64>,
    full_load: bool,
) -> f64 {
    let (true, Some(received), Some(replayed)) = (head.standby, head.received, head.replayed)
    else {
        return head.now;
    };
    let read = receipts.iter().rev().find(|(_, r)| *r <= replayed);
    let read = read.map(|(at, _)| *at);
    if receipts.len() == RECEIPTS {
        receipts.pop_front();
    }
    receipts.push_back((head.now, received));
    if received <= replayed {
        return head.now;
    }
    let replay = head.replayed_at.map(|at| at.min(head.now));
    [read, replay, before.filter(|_| !full_load)]
        .into_iter()
        .flatten()
        .reduce(f64::max)
        .or(before)
        .unwrap_or(head.now)
}

impl Head {
    fn from_row(row: &Row) -> Result<Head, tokio_postgres::Error> {
        Ok(Head {
            epoch: row.try_get(0)?,
            pruned_id: row.try_get(1)?,
            pruned_xid: row.try_get(2)?,
            top: row.try_get(3)?,
            xip: row.try_get(4)?,
            horizon: row.try_get(5)?,
            now: row.try_get(6)?,
            standby: row.try_get(7)?,
            received: row.try_get(8)?,
            replayed: row.try_get(9)?,
            replayed_at: row.try_get(10)?,
            log_table: row.try_get(11)?,
            links_triggered: row.try_get(12)?,
            wal: row.try_get(13)?,
            top_change: row.try_get(14)?,
        })
    }

    /// Whether the change log's tables were made again since `known` (their oid) and `links`
    /// has no triggers yet: a restore under way, whose `links` a full load would find empty or
    /// partly loaded, the rest of its rows then unlogged.
    fn restoring(&self, known: Option<i64>) -> bool {
        !self.links_triggered && known.is_some_and(|t| t != self.log_table)
    }

    /// Whether this server is behind the read that left the table at `at` (a lagging standby of
    /// the same history, taking over from the primary or a standby further on): its state of
    /// `links` is older than the table's, and the change log seen from it would take the table
    /// back (a TRUNCATE it has not replayed reads as one to load again; the rows a read reads
    /// again from its horizon on as their older versions).
    fn behind(&self, at: &Position) -> bool {
        matches!((self.wal, at.wal), (Some(now), Some(read)) if now < read)
    }

    /// Whether this server's change log, the one the table was read from (the same tables),
    /// lacks a change the table applied: change `at.last_id` is now `now`, another, or gone
    /// from a primary that did not prune it. A primary restored from a copy of its files, or
    /// crashed having lost what it committed asynchronously, then gives its next changes ids
    /// the table has read past; or a standby of one. Its WAL may be past the position already
    /// (other databases' writes), so this asks the log itself.
    fn lacks_applied(&self, at: &Position, now: Option<&str>) -> bool {
        let Some(applied) = at.last_change.as_deref() else {
            return false;
        };
        if self.log_table != at.log_table {
            return false;
        }
        match now {
            // Another, or a change of an id pruned before (`PRUNED`): one handed out again.
            Some(now) => now != applied,
            None => !self.standby && self.pruned_id < at.last_id,
        }
    }

    /// Why the change log cannot bring a table at `at` up to date, if it cannot.
    fn needs_full_load(&self, at: Option<&Position>) -> Option<&'static str> {
        let Some(at) = at else {
            return Some("first load");
        };
        if self.log_table != at.log_table {
            return Some("the change log's tables were made again (a restore, a new database)");
        }
        if self.epoch != at.epoch {
            return Some("links was truncated");
        }
        // Rows above our id were pruned, or rows of a transaction we still had to read: one
        // that has finished since (a transaction still running has nothing pruned yet), or
        // one our last read's horizon left out.
        let pruned_xid = self.pruned_xid >= at.horizon
            || at
                .in_progress
                .iter()
                .any(|x| *x <= self.pruned_xid && !self.xip.contains(x));
        (self.pruned_id > at.last_id || pruned_xid).then_some("the change log was pruned past us")
    }

    /// Where a read in this snapshot leaves us. Pruned ids count as read: either they were
    /// read before, or this read was a full load, which covers them.
    fn position(&self, before: Option<&Position>) -> Position {
        // Another log's (its tables made again): its ids say nothing of this one's.
        let before = before.filter(|p| p.log_table == self.log_table);
        let last_id = self
            .top
            .max(self.pruned_id)
            .max(before.map_or(0, |p| p.last_id));
        let last_change = match before {
            _ if self.top == last_id && last_id > 0 => self.top_change.clone(),
            Some(p) if p.last_id == last_id => p.last_change.clone(),
            _ if self.pruned_id == last_id && last_id > 0 => Some(PRUNED.into()),
            _ => None,
        };
        Position {
            last_id,
            last_change,
            in_progress: self.xip.clone(),
            horizon: self.horizon,
            epoch: self.epoch,
            log_table: self.log_table,
            wal: self.wal.max(before.and_then(|p| p.wal)),
        }
    }
}

struct Loader {
    links: Arc<LinkTable>,
    metrics: Arc<Metrics>,
    options: Options,
    position: Option<Position>,
    /// The history of the server the last session read (`HISTORY`), if it said.
    history: Option<String>,
    /// `Head::log_table` as of the table served, kept when the position is let go (a new
    /// session on a server whose history is unknown), so that a full load can tell the log's
    /// tables made again too.
    log_table: Option<i64>,
    /// Codes left out for a bad code or URL, for the `links_skipped` gauge.
    skipped: HashSet<Box<[u8]>>,
    /// The table's bytes of the link being applied (`check`), reused.
    value: Vec<u8>,
    /// Whether the last read found the server a hot standby.
    standby: bool,
    /// Whether the last read found the server behind the table served (`Head::behind`).
    behind: bool,
    /// This session's last reads of a hot standby, oldest first: each one's clock and how far
    /// the standby had then received WAL (see [`current_to`]).
    receipts: VecDeque<(f64, i64)>,
    /// The change ids the last read of changes returned (each code's highest). A standby's
    /// read returns every change from its horizon on again (`Head::horizon`): those it
    /// returned before are applied again, harmlessly, but neither counted as changes applied
    /// nor timed as lag, which would grow for as long as a transaction stays open.
    returned: HashSet<i64>,
}

impl Loader {
    fn new(links: Arc<LinkTable>, metrics: Arc<Metrics>, options: Options) -> Loader {
        Loader {
            links,
            metrics,
            options,
            position: None,
            history: None,
            log_table: None,
            skipped: HashSet::new(),
            value: Vec::new(),
            standby: false,
            behind: false,
            receipts: VecDeque::new(),
            returned: HashSet::new(),
        }
    }

    async fn run(&mut self, config: &shared::db::Config) {
        let mut backoff = shared::db::backoff();
        loop {
            let err = self.session(config, &mut backoff).await;
            // Between sessions it neither listens nor polls.
            self.metrics.links_polling.set(0);
            if let SessionError::Promoted = err {
                tracing::info!(
                    "the links database was a hot standby and is now promoted: a new session \
                     listens for changes"
                );
                continue;
            }
            self.metrics.link_load_errors.inc();
            let wait = backoff.next_wait();
            tracing::warn!(
                error = %err,
                links = self.metrics.links.get(),
                "link table: {err}; serving the last table ({} links), retrying in {wait:?}",
                self.metrics.links.get()
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// Waits for `f` for at most the timeout.
    async fn timed<T, E>(&self, f: impl Future<Output = Result<T, E>>) -> Result<T, SessionError>
    where
        SessionError: From<E>,
    {
        match tokio::time::timeout(self.options.timeout, f).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(SessionError::Timeout(self.options.timeout)),
        }
    }

    /// One database session: LISTEN, bring the table up to date, then again on each
    /// notification (or, while changes keep coming, each [`DEBOUNCE`]) and each poll tick,
    /// until something fails.
    async fn session(
        &mut self,
        config: &shared::db::Config,
        backoff: &mut Backoff,
    ) -> SessionError {
        let (mut client, connection) = match self.timed(config.connect_raw()).await {
            Ok(pair) => pair,
            Err(e) => return e,
        };
        let changed = Arc::new(Notify::new());
        let mut driver = AbortOnDrop(tokio::spawn(drive(connection, changed.clone())));
        // Another server's, or the same one's from before: not comparable.
        self.receipts.clear();
        // Said again of this session's server, if it is behind too.
        self.behind = false;
        // The search path pinned first, as in every session of the services. Each read is
        // planned for its own position: a generic plan would guess at `id > $1`. A
        // `SQL_ASCII` database holds any bytes, which the server refuses to send as UTF-8,
        // failing the whole read: there the rows come as stored, and `check` skips a URL
        // that is not UTF-8 (elsewhere the server converts to UTF-8 as it should).
        let setup = format!(
            "{}; SET plan_cache_mode = force_custom_plan; {SQL_ASCII_AS_STORED}",
            shared::db::set_statement_timeout(self.options.timeout)
        );
        if let Err(e) = self.timed(config.set_up(&client, &setup)).await {
            return e;
        }
        // A hot standby refuses LISTEN (and NOTIFY never reaches it): there the change log
        // is read every --reload-interval, and never every DEBOUNCE, which would only poll
        // faster than the changes can replicate.
        let standby = match self.timed(standby::in_recovery(&client)).await {
            Ok(standby) => standby,
            Err(e) => return e,
        };
        if standby {
            // Before the line that says so: whoever reads that line reads the gauge.
            self.metrics.links_polling.set(1);
            standby::following(&self.options);
        } else if let Err(e) = self
            .timed(client.batch_execute("LISTEN links_changed"))
            .await
        {
            // LISTEN before the first read, so that no change between the two goes unseen.
            return e;
        }
        if let Err(e) = self.check_history(&client).await {
            return e;
        }
        let read = match self.timed(client.prepare(READ)).await {
            Ok(read) => read,
            Err(e) => return e,
        };
        let mut tick = tokio::time::interval(self.options.poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut listening = !standby;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = changed.notified(), if listening => tokio::time::sleep(DEBOUNCE).await,
                _ = tokio::time::sleep(DEBOUNCE), if !listening && !standby => {}
                _ = &mut driver.0 => return SessionError::Closed,
            }
            if standby {
                match self.sync(&mut client, &read).await {
                    Ok(_) if !self.standby => return SessionError::Promoted,
                    Ok(_) => backoff.reset(),
                    Err(e) => return e,
                }
                continue;
            }
            listening = match self.follow(&mut client, &read, listening, &changed).await {
                Ok(listening) => listening,
                Err(e) => return e,
            };
            backoff.reset();
        }
    }

    /// Forgets the position unless this server's history is known to be the one it was read
    /// on: the same cluster (system identifier) on the same timeline. Another timeline (a
    /// failover, a restore to a point in time) or another cluster (a restore from a dump) may
    /// lack changes this table has applied and hand their ids to new ones, so only a full load,
    /// which compares, can say what the table must drop. Where either is unknown (a standby's
    /// timeline is in `pg_stat_wal_receiver`, which wants `pg_read_all_stats`; none while no
    /// receiver streams), every new session loads the whole table, and so does the first
    /// session after one on a server whose history was unknown.
    async fn check_history(&mut self, client: &Client) -> Result<(), SessionError> {
        let visible: bool = self
            .timed(client.query_one(HISTORY_VISIBLE, &[]))
            .await?
            .try_get(0)?;
        let now: Option<String> = match visible {
            true => self
                .timed(client.query_one(HISTORY, &[]))
                .await?
                .try_get(0)?,
            false => None,
        };
        let same = now.is_some() && now == self.history;
        if !same && self.position.take().is_some() {
            let (before, after) = (self.history.as_deref(), now.as_deref());
            let [before, after] = [before, after].map(|h| h.unwrap_or("unknown to this role"));
            tracing::warn!(
                "the links database's history is {after}, not {before} as read before (system \
                 identifier/timeline): loading the whole table, comparing, which may have lost \
                 changes"
            );
        }
        self.history = now;
        Ok(())
    }

    /// Reads the log, then switches between waiting for notifications and polling. While
    /// changes keep coming, a read each [`DEBOUNCE`] finds them without a notification per
    /// change waking this thread and a backend (BENCHMARKS.md, "What following costs");
    /// once a read finds nothing new, LISTEN again, and read once more for what committed
    /// before the LISTEN. Returns whether the session now listens.
    async fn follow(
        &mut self,
        client: &mut Client,
        read: &Statement,
        listening: bool,
        wake: &Notify,
    ) -> Result<bool, SessionError> {
        let found = self.sync(client, read).await?;
        if listening && found {
            self.timed(client.batch_execute("UNLISTEN links_changed"))
                .await?;
            self.metrics.links_polling.set(1);
            return Ok(false);
        }
        if !listening && !found {
            self.timed(client.batch_execute("LISTEN links_changed"))
                .await?;
            self.metrics.links_polling.set(0);
            // A wake-up left from before the UNLISTEN: the read below covers it.
            let _ = wake.notified().now_or_never();
            self.sync(client, read).await?;
            return Ok(true);
        }
        Ok(listening)
    }

    /// One read of the change log: apply what changed or, when the log cannot bring the table
    /// up to date, load everything. Returns whether a read of the log applied a change (a
    /// full load says no: it leaves nothing to poll for).
    async fn sync(&mut self, client: &mut Client, read: &Statement) -> Result<bool, SessionError> {
        let why = match self.position.clone() {
            None if self.links.is_loaded() => "the server's history is not known to be the same",
            None => "first load",
            Some(at) => match self.apply_changes(client, read, &at).await? {
                Read::Applied(head, codes) => {
                    self.synced(&head, false);
                    return Ok(codes > 0);
                }
                Read::Lagging(head) => {
                    self.lagging(&head, &at);
                    return Ok(false);
                }
                Read::Rewound => {
                    self.position = None;
                    tracing::warn!(
                        "the links database lacks changes the table served applied, on the \
                         same history (restored from a copy of its files, or crashed having lost \
                         what it committed asynchronously): loading the whole table, comparing"
                    );
                    "the server lacks changes the table applied"
                }
                Read::Behind(why) => why,
            },
        };
        let head = self.full_load(client, why).await?;
        self.synced(&head, true);
        Ok(false)
    }

    /// A read found the server behind the table (`Head::behind`): nothing applied, and the
    /// table counts as no more current than it was (`links_synced` stays, so LinksStale fires
    /// if the server stays behind); said once for each time it falls behind.
    fn lagging(&mut self, head: &Head, at: &Position) {
        self.metrics.link_reads_behind.inc();
        self.standby = head.standby;
        if !std::mem::replace(&mut self.behind, true) {
            let (now, read) = (head.wal.unwrap_or(0), at.wal.unwrap_or(0));
            tracing::warn!(
                behind_bytes = read - now,
                "the links database is {} bytes of WAL behind what the table served was read \
                 at (a standby that has not replayed as far, on the same history): serving the \
                 table as it is until the server catches up",
                read - now
            );
        }
    }

    /// The table is as `links` was at `head`'s snapshot, in full after a full load.
    fn synced(&mut self, head: &Head, full_load: bool) {
        if std::mem::replace(&mut self.behind, false) {
            tracing::info!("the links database caught up with the table served");
        }
        self.position = Some(head.position(self.position.as_ref()));
        self.log_table = Some(head.log_table);
        let before = Some(self.metrics.links_synced.get()).filter(|&g| g > 0.0);
        let current = current_to(&mut self.receipts, head, before, full_load);
        self.metrics.links_synced.set(current);
        self.standby = head.standby;
        self.metrics.links.set(self.links.table.len() as i64);
        self.metrics.links_skipped.set(self.skipped.len() as i64);
    }

    /// Applies each code changed since `at`, as it is in the read's snapshot, unless the log
    /// cannot bring the table up to date from there.
    async fn apply_changes(
        &mut self,
        client: &Client,
        read: &Statement,
        at: &Position,
    ) -> Result<Read, SessionError> {
        let params: [&(dyn ToSql + Sync); 5] = [
            &at.last_id,
            &at.in_progress,
            &at.horizon,
            &at.epoch,
            &LOG_READ_MAX,
        ];
        let read_at = Instant::now();
        let mut rows = Box::pin(self.timed(client.query_raw(read, params)).await?);
        let mut row = self.timed(next(rows.as_mut())).await?;
        let first = row.as_ref().ok_or(SessionError::NoState)?;
        let head = Head::from_row(first)?;
        let at_change: Option<String> = first.try_get(HEAD_COLUMNS + 1)?;
        if head.lacks_applied(at, at_change.as_deref()) {
            return Ok(Read::Rewound);
        }
        if head.behind(at) {
            return Ok(match head.standby {
                true => Read::Lagging(head),
                false => Read::Rewound,
            });
        }
        if head.restoring(Some(at.log_table)) {
            return Err(SessionError::Restoring);
        }
        if let Some(why) = head.needs_full_load(Some(at)) {
            return Ok(Read::Behind(why));
        }
        if first.try_get::<_, i64>(HEAD_COLUMNS)? > LOG_READ_MAX {
            return Ok(Read::Behind("more changes than one read takes"));
        }
        let links = self.links.clone();
        let mut batch = Batch::new(&links.table, false);
        let (mut codes, mut newest) = (0u64, f64::MIN);
        let mut returned = HashSet::new();
        while let Some(r) = row {
            if let Some(TextBytes(code)) = r.try_get(HEAD_COLUMNS + 2)? {
                batch.set(code, self.check(code, link_of(&r, HEAD_COLUMNS + 3)?));
                let id: i64 = r.try_get(HEAD_COLUMNS + 8)?;
                if id > at.last_id || !self.returned.contains(&id) {
                    codes += 1;
                    newest = newest.max(r.try_get::<_, f64>(HEAD_COLUMNS + 7)?);
                }
                returned.insert(id);
            }
            row = self.timed(next(rows.as_mut())).await?;
        }
        batch.finish();
        self.returned = returned;
        if codes > 0 {
            self.metrics.link_changes_applied.inc_by(codes);
            let lag = head.now - newest + read_at.elapsed().as_secs_f64();
            self.metrics.links_lag.set(lag.max(0.0));
            tracing::debug!(codes, lag, "applied {codes} link changes, lag {lag:.3} s");
        }
        Ok(Read::Applied(head, codes))
    }

    /// Loads every row of `links`, in one REPEATABLE READ snapshot with the head it returns.
    /// While a table is being served this compares instead of rebuilding: a pass over the
    /// codes removes what `links` no longer has, then rows that differ are applied shard by
    /// shard. In that order: the other way round, a `links` replaced by as many other codes
    /// (a TRUNCATE and a reload, a dump of another database restored) held both sets, twice
    /// the table, until the removal (and served the links gone until then).
    async fn full_load(&mut self, client: &mut Client, why: &str) -> Result<Head, SessionError> {
        let begin = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start();
        let tx = self.timed(begin).await?;
        // The client-side timeout guards each row instead: a big table takes a while. Not the
        // wait for its lock (a bulk reload of `links` in one transaction holds it, taken
        // after this session prepared READ, whose statement timeout bounds its own wait): the
        // server would wait on after this session gave up. A quarter shorter, so that the
        // server's error, which says what it waited for, comes first. The lock is taken
        // before the snapshot (HEAD's): a TRUNCATE (or a rewriting ALTER TABLE) that commits
        // between the two leaves a snapshot taken before it reading the new, empty file, and
        // every link was removed from the table served.
        let lock_wait = self.options.timeout * 3 / 4;
        let lock_timeout = shared::db::timeout_setting("lock_timeout", lock_wait);
        let unbounded = format!(
            "SET LOCAL statement_timeout = 0; SET LOCAL {lock_timeout};
             LOCK TABLE links IN ACCESS SHARE MODE"
        );
        self.timed(tx.batch_execute(&unbounded)).await?;
        let head = Head::from_row(&self.timed(tx.query_one(HEAD, &[])).await?)?;
        let started = Instant::now();
        let serving = self.links.is_loaded();
        if serving && head.restoring(self.log_table) {
            return Err(SessionError::Restoring);
        }
        self.skipped.clear();
        self.returned.clear();
        let no_params: [&(dyn ToSql + Sync); 0] = [];
        let removed = if serving {
            self.remove_unseen(&tx).await?
        } else {
            0
        };
        let mut rows = Box::pin(self.timed(tx.query_raw(ALL_LINKS, no_params)).await?);
        let links = self.links.clone();
        let mut batch = Batch::new(&links.table, !serving);
        while let Some(row) = self.timed(next(rows.as_mut())).await? {
            let TextBytes(code) = row.try_get(0)?;
            batch.set(code, self.check(code, link_of(&row, 1)?));
        }
        let changed = removed + batch.finish();
        self.log_skipped();
        self.metrics.link_loads.inc();
        self.metrics.links_lag.set(started.elapsed().as_secs_f64());
        // Before the table is said to be loaded, so that whoever sees it ready (`/healthz`)
        // reads its size too (`synced` sets it again once the load committed).
        self.metrics.links.set(self.links.table.len() as i64);
        self.metrics.links_skipped.set(self.skipped.len() as i64);
        self.links.set_loaded();
        tracing::info!(
            why = %why,
            links = self.links.table.len(),
            changed,
            "link table loaded ({why}): {} links, {changed} changed, in {:?}",
            self.links.table.len(),
            started.elapsed()
        );
        self.timed(tx.commit()).await?;
        Ok(head)
    }

    /// The first pass of a comparison: removes the links `links` does not have.
    async fn remove_unseen(&mut self, tx: &Transaction<'_>) -> Result<u64, SessionError> {
        let mut seen = Seen::new(&self.links.table);
        let no_params: [&(dyn ToSql + Sync); 0] = [];
        let mut rows = Box::pin(self.timed(tx.query_raw(ALL_CODES, no_params)).await?);
        while let Some(row) = self.timed(next(rows.as_mut())).await? {
            seen.mark(&self.links.table, row.try_get::<_, TextBytes>(0)?.0);
        }
        Ok(seen.remove_unseen(&self.links.table))
    }

    /// The table's bytes for `link` (`target::encode`) if it can be served; otherwise `None`,
    /// and the code is counted as skipped.
    fn check(&mut self, code: &[u8], link: Option<(&[u8], LinkOptions)>) -> Option<&[u8]> {
        // Said once: a standby's reads take the rows of transactions still open on the primary
        // again at every poll, a skipped one among them.
        let said = !self.skipped.is_empty() && self.skipped.remove(code);
        let (url, options) = link?;
        let encoded = usable(code, url).and_then(|()| {
            target::encode(&options, url, &mut self.value).map_err(Unusable::Status)
        });
        match encoded {
            Ok(()) => Some(&self.value),
            Err(why) => {
                if self.skipped.len() < SKIPPED_LOGGED && !said {
                    // Escaped: a byte that is not UTF-8 shows as itself (`\xe9`).
                    let (code, url) = (code.escape_ascii(), url.escape_ascii());
                    let what = format!("skipping link \"{code}\" -> \"{url}\": {why}");
                    tracing::warn!(%code, reason = %why, "{what}");
                }
                self.skipped.insert(code.into());
                None
            }
        }
    }

    fn log_skipped(&self) {
        if self.skipped.len() > SKIPPED_LOGGED {
            let skipped = self.skipped.len();
            tracing::warn!(skipped, "skipped {skipped} links in all");
        }
    }
}

/// The next row of a stream.
async fn next(
    mut rows: std::pin::Pin<&mut tokio_postgres::RowStream>,
) -> Result<Option<Row>, tokio_postgres::Error> {
    rows.next().await.transpose()
}

/// Drives the connection and turns each `links_changed` notification into a wake-up.
async fn drive(mut connection: shared::db::Connection, changed: Arc<Notify>) {
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(AsyncMessage::Notification(_))) => changed.notify_one(),
            Some(Ok(AsyncMessage::Notice(n))) => tracing::info!("database notice: {}", n.message()),
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                let error = shared::db::describe(&e);
                tracing::warn!(%error, "link table connection: {error}");
                return;
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests;
