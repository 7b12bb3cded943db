//! The transaction that stores one batch: its claim (the writer's batch number), its senders'
//! seqs, its clicks, the clicks it set aside, its counts per (code, day) (one
//! `click_count_lists` row per day) and its breakdowns per (code, day, dimension, value) (one
//! `click_breakdown_lists` row per day and dimension), committed together or not at all.

use std::collections::{HashMap, HashSet};
use std::pin::pin;

use bytes::{Bytes, BytesMut};
use futures_util::SinkExt;
use tokio_postgres::{Client, Statement};

use crate::db::describe;
use crate::write::batch::{self, Batch, DayRows, SetAside};
use crate::write::copy::{self, HEADER, TRAILER};
use shared::metrics::Label;

/// Day $1's partition (a number of days since 2000-01-01), if one by its name is attached to
/// clicks, not being detached, and holds the whole day, no more: its name, as a COPY may use
/// it. (The day partitioning began on holds only the part of the day after that moment: the
/// rest is in clicks_before_partitioning. A day made before migration 24 under a DateStyle
/// and TimeZone that shifted it, or next to one (its bounds meet the shifted ones), holds
/// part of another day: a COPY straight into it would refuse the rest.) Its bounds are
/// compared as the session renders them, both sides alike.
pub const WHOLE_DAY: &str = "
    SELECT c.oid::regclass::text FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'clicks'::regclass AND NOT i.inhdetachpending
      AND c.relname = 'clicks_p' || to_char(date '2000-01-01' + $1::int, 'YYYYMMDD')
      AND pg_get_expr(c.relpartbound, c.oid)
          = format('FOR VALUES FROM (%L) TO (%L)',
                   (date '2000-01-01' + $1::int)::timestamp AT TIME ZONE 'UTC',
                   (date '2000-01-01' + $1::int + 1)::timestamp AT TIME ZONE 'UTC')";

/// Whether the table named $1 is still a partition of clicks, not being detached. Asked after
/// a COPY straight into it, in the same transaction: the COPY's lock keeps a plain `DETACH`
/// off from then until the commit, and a detach that came before shows here. Not the first
/// step of a `DETACH ... CONCURRENTLY`, whose lock the COPY's does not conflict with: it may
/// mark the partition after this, and its second step, which waits for this transaction, then
/// takes this batch's rows with the partition (one batch a collector; the next waits here).
const ATTACHED: &str = "
    SELECT EXISTS (SELECT FROM pg_inherits
                    WHERE inhrelid = to_regclass($1) AND inhparent = 'clicks'::regclass
                      AND NOT inhdetachpending)";

const COPY_CLICKS: &str = "COPY clicks (code, clicked_at) FROM STDIN (FORMAT binary)";
/// A code of a click `clicks` took, not one of $1 (the batch's, and those refused as probes),
/// for [`another_code`] where click_counts has none: the first row a scan meets, read only
/// when the table refuses clicks. The scan stops after 100,000 rows: where a few codes are in
/// every batch, a history of them holds no other, and a scan of all of it outlived the
/// attempt (its backend, which does not notice a client gone, then held the instance lock
/// from the retries). `NOT = ANY`, not `<> ALL`: PostgreSQL 14 hashes the first over a
/// batch's codes, and compares the second one by one.
const A_CODE_TAKEN: &str = "
    SELECT code FROM (SELECT code FROM clicks LIMIT 100000) AS c WHERE NOT code = ANY($1) LIMIT 1";
/// The next $2 codes of click_counts after $1, in order, each whether it is $3 or after it,
/// for [`another_code`]: one probe of its key's index a code, however many days it has, and
/// however many of them are left out, which the collector leaves out (a batch may hold 100,000
/// codes, which `<> ALL` compares one by one before PostgreSQL 15).
const WALK_AFTER: &str = "
    WITH RECURSIVE walk (code, n) AS (
        (SELECT code, 1 FROM click_counts WHERE code > $1 ORDER BY code LIMIT 1)
        UNION ALL
        SELECT (SELECT c.code FROM click_counts AS c WHERE c.code > w.code ORDER BY c.code LIMIT 1),
               w.n + 1
          FROM walk AS w
         WHERE w.code IS NOT NULL AND w.n < $2)
    SELECT code, code >= $3 FROM walk WHERE code IS NOT NULL ORDER BY n";
/// The codes of one step of the walk ([`WALK_AFTER`]), and the steps of one look.
const WALK_STEP: i32 = 1_000;
const LOOK_STEPS: usize = 10;
const COPY_SET_ASIDE: &str =
    "COPY clicks_set_aside (code, clicked_at, reason, error) FROM STDIN (FORMAT binary)";
const COPY_COUNTS: &str =
    "COPY click_count_lists (day, entries, code_list, count_list, writer, batch)
     FROM STDIN (FORMAT binary)";
const COPY_BREAKDOWNS: &str = "
    COPY click_breakdown_lists
         (day, dimension, entries, code_list, value_list, count_list, writer, batch)
    FROM STDIN (FORMAT binary)";
/// Claims the batch's number for this writer (collector process), as the transaction's first
/// statement: the writer's row is inserted, or moved forward only if its committed number is
/// below the batch's, and returned if so. In READ COMMITTED a row (or, for a first batch, a
/// unique-index entry) that an unfinished earlier attempt wrote makes this wait for it and then
/// re-check against what it committed: an orphaned attempt whose COMMIT lands after a retry
/// began is seen by the retry, which then finds no row and does not write the batch twice.
/// Keyed by writer, not by sender: seqs that another collector committed for the same senders
/// say nothing about whether this batch is in. Each writer has a row of its own, so writers of
/// different instances never wait for each other here.
const CLAIM_BATCH: &str = "
    INSERT INTO click_writers (writer, last_batch, instance) VALUES ($1, $2, $3)
    ON CONFLICT (writer) DO UPDATE
       SET last_batch = EXCLUDED.last_batch, updated_at = now()
       WHERE click_writers.last_batch < EXCLUDED.last_batch
    RETURNING 1";
/// Moves the batch's senders' committed seqs, and their clicks up to them, forward (never
/// back: a collector whose instance lock session was lost may commit late), in sender order so
/// that two writers updating the same senders lock their rows in the same order. Each row is
/// marked with the instance whose collector judges that sender, and with the address its
/// acknowledgements go to (migration 19: what a restarted collector takes its id from; none
/// noted keeps the one recorded). Also what puts back the records a failover lost
/// (`replication`).
pub(crate) const ADVANCE_SENDERS: &str = "
    INSERT INTO click_senders
           (sender, last_seq, clicks, instance, reply_to, reply_uid, updated_at)
    SELECT sender, last_seq, clicks, $4, reply_to, reply_uid, now()
      FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $5::bytea[], $6::bigint[])
           AS s(sender, last_seq, clicks, reply_to, reply_uid)
    ORDER BY sender
    ON CONFLICT (sender) DO UPDATE
       SET last_seq = GREATEST(click_senders.last_seq, EXCLUDED.last_seq),
           clicks = CASE WHEN EXCLUDED.last_seq >= click_senders.last_seq
                         THEN EXCLUDED.clicks ELSE click_senders.clicks END,
           reply_to = CASE WHEN EXCLUDED.last_seq >= click_senders.last_seq
                                AND EXCLUDED.reply_to IS NOT NULL
                           THEN EXCLUDED.reply_to ELSE click_senders.reply_to END,
           reply_uid = CASE WHEN EXCLUDED.last_seq >= click_senders.last_seq
                                 AND EXCLUDED.reply_to IS NOT NULL
                            THEN EXCLUDED.reply_uid ELSE click_senders.reply_uid END,
           instance = EXCLUDED.instance, updated_at = now()";

/// Sender ids the collector forgot (idle, or past its bounds under a flood of fresh ids): their
/// rows go, so that click_senders stays as bounded as the collector's memory; only this
/// instance's (and unmarked ones from before instances were recorded), never another host's.
const FORGET_SENDERS: &str = "
    DELETE FROM click_senders
     WHERE sender = ANY($1::bigint[]) AND (instance = $2 OR instance IS NULL)";

/// Which batch of which writer: each collector process writes as a random writer id, under
/// its instance name, and numbers its batches 1, 2, 3, ... in the order it writes them; a
/// retry keeps the number.
#[derive(Debug, Clone)]
pub(crate) struct BatchNumber {
    pub(crate) writer: i64,
    pub(crate) instance: String,
    pub(crate) batch: i64,
}

impl BatchNumber {
    /// The columns that tie the batch's `click_count_lists` and `click_breakdown_lists` rows
    /// to it.
    pub(crate) fn tag(&self) -> copy::BatchTag {
        copy::BatchTag {
            writer: self.writer,
            batch: self.batch,
        }
    }
}

/// A batch's COPY rows, taken out of it once: the same bytes for every attempt.
#[derive(Debug)]
pub(crate) struct Rows {
    /// Per UTC day, with the clicks' dimensions.
    pub(crate) clicks: Vec<DayRows>,
    pub(crate) set_aside: Bytes,
}

impl Rows {
    /// The code of the first click, if any.
    pub(crate) fn first_code(&self) -> Option<&str> {
        let day = self.clicks.first()?;
        copy::first_click(&day.rows).map(|row| row.code)
    }
}

/// What an attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stored {
    /// Committed; `refused` clicks PostgreSQL refused for good were set aside instead.
    Written { refused: u64 },
    /// An earlier attempt had committed it, `refused` clicks set aside (the count of the last
    /// attempt to reach its COMMIT, the one that landed): not written again.
    AlreadyCommitted { refused: u64 },
    /// PostgreSQL refused every click of the batch (this error, the first), and a click the
    /// table took before too, or there was none to try (`Attempts::probe`): not taken as bad
    /// clicks but as a table that refuses everything; nothing was committed. (Unless every
    /// click is of a day before today without a partition: those are set aside.)
    AllRefused(String),
    /// Not written, for a while (this reason): clicks of today or later without a partition
    /// yet (the partitions task makes it; set aside, they would leave `clicks` for good), or
    /// a day's partition detached since this connection COPYed straight into it.
    Retry(String),
}

/// Whether PostgreSQL would refuse the same rows again however often they are sent: a data
/// exception (SQLSTATE class 22) or an integrity constraint violation (23). Not the classes of
/// a schema that does not match (42: a missing table or column, a privilege): those refuse
/// every row, and setting every click aside would only move the stream elsewhere, so they are
/// retried like an outage until an operator fixes the schema.
pub(crate) fn refuses_rows(e: &tokio_postgres::Error) -> bool {
    e.code()
        .is_some_and(|c| c.code().starts_with("22") || c.code().starts_with("23"))
}

/// The attempts at one batch: whether they sift its rows (see [`Conn::write`]), and how many
/// clicks the last one to reach its COMMIT refused. A later attempt that finds the batch
/// committed (that COMMIT's answer lost) counts those set aside, not written.
#[derive(Debug, Default)]
pub(crate) struct Attempts {
    pub(crate) sift: bool,
    refused_at_commit: u64,
    /// Clicks found refused for good by attempts before (by UTC day, their indexes among the
    /// day's rows, with the error), as each was found: the next attempt sets them aside
    /// without trying them again, so that a batch of many bad clicks, whose sifting outlives
    /// one attempt's deadline, gets further at each one and lands.
    known_refused: HashMap<i32, Vec<(usize, String)>>,
    /// What tells bad clicks from a table that takes none (`takes`).
    pub(crate) probe: Probe,
}

/// A click tried, and rolled back, when the table refuses a batch's clicks: taken, they are
/// bad clicks; refused too, the table may be taking none.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    /// A code whose click the table took in an earlier batch. Without one, a code `clicks`
    /// holds (`takes`).
    pub(crate) code: Option<String>,
    /// Codes refused as probes in this attempt at the batch: not tried again in it, so that
    /// its next look tries another.
    refused: Vec<String>,
    /// The last of click_counts' codes probed by the attempts at the batch: the next look
    /// takes the code after it, in order, round again past the last ([`another_code`]). Each
    /// attempt began its looks afresh once, so they tried the same few codes, and a batch
    /// whose every click was refused, as were those few codes (a constraint refusing the
    /// codes of links gone), was held as one a table refusing everything, for good.
    after: String,
    /// Where the walk began to find no code for this batch, and whether it has been round the
    /// end since: past that place again, it has read every code, and the attempt's later
    /// looks fall back on one of `clicks` ([`another_code`]). A round under way is kept across
    /// the attempts at the batch (an attempt makes a few looks, and a round longer than they
    /// read was never done); one done, for its attempt only.
    fruitless: Option<Fruitless>,
    /// The codes of `clicks` ([`A_CODE_TAKEN`]) the attempts at the batch have tried: its
    /// next look passes over them, and once it finds no other, begins again. Forgotten at
    /// each attempt as `refused` is, its scan, which meets the table's rows in the same order
    /// each time, offered the same first few codes every time, and a batch whose every click
    /// was refused, as were they, was held for good. At most [`SCANNED_AT_MOST`].
    scanned: Vec<String>,
    /// A probe was taken in this attempt: the table takes rows, whatever day or look asks.
    taken: bool,
}

#[derive(Debug, Default)]
struct Fruitless {
    from: String,
    wrapped: bool,
    /// Round: every code read.
    done: bool,
}

impl Probe {
    /// What a new attempt at the batch keeps of the probe: its code, its place in the walk,
    /// and a round under way. Codes refused are ruled out for an attempt only: kept across
    /// attempts, a table refusing everything for a while would rule out every code `clicks`
    /// holds (those its scan offered are kept, and offered again once it offers none:
    /// `scanned`). A round done, over codes this attempt may no longer refuse and a table a fold
    /// may have added to since, is begun again.
    fn begin_an_attempt(&mut self) {
        self.refused.clear();
        self.taken = false;
        if self.fruitless.as_ref().is_some_and(|f| f.done) {
            self.fruitless = None;
        }
    }
}

impl Attempts {
    /// The attempts at a new batch, with the probe the batch before left them: its code and
    /// its place in the walk, not what it found of the codes, which were that batch's.
    pub(crate) fn with_probe(mut probe: Probe) -> Attempts {
        probe.fruitless = None;
        probe.scanned.clear();
        Attempts {
            probe,
            ..Attempts::default()
        }
    }

    /// Clicks found refused for good so far.
    pub(crate) fn found_refused(&self) -> usize {
        self.known_refused.values().map(Vec::len).sum()
    }
}

/// The writer's connection, with its statements prepared once when it opens. Its session
/// holds the instance lock (`lock`), taken before it is prepared.
pub struct Conn {
    client: Client,
    copy_clicks: Statement,
    /// COPYs straight into a day's partition (and its name), by day; `None`: the day goes
    /// through `clicks`. PostgreSQL 15 routing each row through the parent (`perf`:
    /// ExecFindPartition) cost ingest a tenth (BENCHMARKS.md, "Ingest, partitioned beside
    /// unpartitioned").
    copy_day: HashMap<i32, Option<(Statement, String)>>,
    attached: Statement,
    copy_counts: Statement,
    copy_breakdowns: Statement,
    copy_set_aside: Statement,
    claim_batch: Statement,
    advance_senders: Statement,
    forget_senders: Statement,
}

/// The deferrable constraints of `clicks` and its partitions (foreign keys, constraint
/// triggers), as a list for SET CONSTRAINTS; null if none.
const DEFERRED_ON_CLICKS: &str = "
    SELECT string_agg(DISTINCT format('%I.%I', n.nspname, c.conname), ', ')
    FROM pg_constraint AS c JOIN pg_namespace AS n ON n.oid = c.connamespace
    WHERE c.condeferrable
      AND c.conrelid IN (SELECT relid FROM pg_partition_tree('clicks'))";

/// Has the session's commits return only once durable, replicated to a synchronous standby
/// if there is one, whatever the server's default: the writer's commits are acknowledged to
/// the senders, who then forget those clicks; start-up's (in the session the writer goes on
/// with) are watched as the writer's are.
pub(crate) async fn durable_commits(client: &Client) -> Result<(), tokio_postgres::Error> {
    client.batch_execute("SET synchronous_commit = on").await
}

impl Conn {
    /// Prepares the statements on `client`.
    pub(crate) async fn prepare(client: Client) -> Result<Conn, tokio_postgres::Error> {
        durable_commits(&client).await?;
        Ok(Conn {
            copy_clicks: client.prepare(COPY_CLICKS).await?,
            copy_day: HashMap::new(),
            attached: client.prepare(ATTACHED).await?,
            copy_counts: client.prepare(COPY_COUNTS).await?,
            copy_breakdowns: client.prepare(COPY_BREAKDOWNS).await?,
            copy_set_aside: client.prepare(COPY_SET_ASIDE).await?,
            claim_batch: client.prepare(CLAIM_BATCH).await?,
            advance_senders: client.prepare(ADVANCE_SENDERS).await?,
            forget_senders: client.prepare(FORGET_SENDERS).await?,
            client,
        })
    }

    /// The session, for what watches it (`replication`).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// One transaction: the claim of batch `number`, senders, clicks, counts, breakdowns,
    /// commit; unless the claim shows that this batch is in already. Dropping it midway rolls
    /// it back. With `attempts.sift`, the clicks go in halves until the rows PostgreSQL refuses for good
    /// are found (`refuses_rows`), which are set aside with their error, their counts and
    /// breakdowns left out.
    pub(crate) async fn write(
        &mut self,
        batch: &Batch,
        rows: &Rows,
        number: &BatchNumber,
        attempts: &mut Attempts,
    ) -> Result<Stored, tokio_postgres::Error> {
        let today = copy::pg_day(protocol::now_us());
        attempts.probe.begin_an_attempt();
        let mut clicks = Vec::with_capacity(rows.clicks.len());
        for day in &rows.clicks {
            clicks.push((self.copy_clicks_of(day.day, today).await?, day));
        }
        let mut tx = self.client.transaction().await?;
        if attempts.sift {
            // A constraint of clicks checked at commit (deferred) refuses the batch at COMMIT,
            // where the sift, which splits the COPY of the clicks, cannot find the row:
            // checked at once, it refuses the COPY that holds it. Those of clicks only: what
            // an operator deferred on another table stays deferred.
            let deferred: Option<String> = tx.query_one(DEFERRED_ON_CLICKS, &[]).await?.get(0);
            if let Some(names) = deferred {
                tx.batch_execute(&format!("SET CONSTRAINTS {names} IMMEDIATE"))
                    .await?;
            }
        }
        let claim = [
            &number.writer as _,
            &number.batch as _,
            &number.instance as _,
        ];
        if tx.query_opt(&self.claim_batch, &claim).await?.is_none() {
            tx.rollback().await?;
            let refused = attempts.refused_at_commit;
            return Ok(Stored::AlreadyCommitted { refused });
        }
        let senders = batch.sender_columns();
        tx.execute(&self.advance_senders, &senders.params(&number.instance))
            .await?;
        // After: an id noted and then pushed out by a flood while the batch filled goes. (One
        // forgotten and then seen again is not in the list: `Batch::forget_only`.)
        let forgotten = batch.forgotten_column();
        if !forgotten.is_empty() {
            let forget = [&forgotten as _, &number.instance as _];
            tx.execute(&self.forget_senders, &forget).await?;
        }
        let (counts, breakdowns, set_aside, refused) = if attempts.sift {
            let mut rows_in = Vec::new();
            let mut dimensions = Vec::new();
            let mut refused = Vec::new();
            let mut unroutable = 0;
            for ((statement, partition), day) in &clicks {
                let day_rows = copy::click_rows(&day.rows);
                let known = attempts.known_refused.entry(day.day).or_default();
                let probe = Probing {
                    copy_clicks: &self.copy_clicks,
                    probe: &mut attempts.probe,
                };
                let (day_refused, day_unroutable) =
                    sift_in(&mut tx, statement, &day.rows, &day_rows, known, probe).await?;
                let wait = must_wait(
                    &tx,
                    &self.attached,
                    partition,
                    day.day >= today,
                    day_unroutable,
                );
                if let Some(why) = wait.await? {
                    tx.rollback().await?;
                    return Ok(Stored::Retry(why));
                }
                unroutable += day_unroutable;
                refused.extend(day_refused.into_iter().map(|(i, e)| (rows_in.len() + i, e)));
                // Logged click by click with the rows: as many, in the same order. (Were one
                // missing, its click would be left out of the breakdowns, never misfiled.)
                let logged = batch::logged_dimensions(&day.dimensions);
                dimensions.extend(logged.into_iter().map(Some).take(day_rows.len()));
                dimensions.resize(rows_in.len() + day_rows.len(), None);
                rows_in.extend(day_rows);
            }
            // Not when each was refused for want of a partition (of a day before today: those
            // of later days were retried above): late clicks of a day dropped while they
            // waited (by retention, a day past the window; or by hand), which held would hold
            // the stream for good.
            let late = unroutable == refused.len();
            if !late
                && !rows_in.is_empty()
                && refused.len() == rows_in.len()
                && !takes(&mut tx, &self.copy_clicks, &mut attempts.probe, &rows_in).await?
            {
                tx.rollback().await?;
                // A table that takes no row: each is tried again once it takes rows.
                attempts.known_refused.clear();
                return Ok(Stored::AllRefused(refused[0].1.clone()));
            }
            let kept = without_refused(
                number.tag(),
                &rows_in,
                &dimensions,
                &refused,
                &rows.set_aside,
            );
            (
                kept.counts,
                kept.breakdowns,
                kept.set_aside,
                refused.len() as u64,
            )
        } else {
            let mut written = 0;
            for ((statement, partition), day) in &clicks {
                written += copy_in(&tx, statement, Bytes::clone(&day.rows)).await?;
                let wait = must_wait(&tx, &self.attached, partition, day.day >= today, 0);
                if let Some(why) = wait.await? {
                    tx.rollback().await?;
                    return Ok(Stored::Retry(why));
                }
            }
            debug_assert_eq!(written, batch.len() as u64);
            let tag = number.tag();
            let (counts, breakdowns) = (batch.count_rows(tag), batch.breakdown_rows(tag));
            (counts, breakdowns, rows.set_aside.clone(), 0)
        };
        if !set_aside.is_empty() {
            copy_in(&tx, &self.copy_set_aside, set_aside).await?;
        }
        copy_in(&tx, &self.copy_counts, counts).await?;
        if !breakdowns.is_empty() {
            copy_in(&tx, &self.copy_breakdowns, breakdowns).await?;
        }
        // Before: an attempt given up on in its COMMIT may still have landed.
        attempts.refused_at_commit = refused;
        tx.commit().await?;
        Ok(Stored::Written { refused })
    }

    /// The statement that COPYs day `day`'s clicks, with the partition it names: straight into
    /// the day's partition when one holds the whole day and the day is not before `today`
    /// (the collector's clock), otherwise into `clicks`, which routes each row (and refuses
    /// one without a partition). Not before today: retention never drops today's partition or
    /// a later one, while an older one may be being detached, and rows COPYed into it then
    /// would go with it. Asked once per day and connection (a failed attempt drops the
    /// connection, and with it what was learnt); whether it is still attached, at each COPY.
    async fn copy_clicks_of(
        &mut self,
        day: i32,
        today: i32,
    ) -> Result<(Statement, Option<String>), tokio_postgres::Error> {
        if day < today {
            return Ok((self.copy_clicks.clone(), None));
        }
        if !self.copy_day.contains_key(&day) {
            self.copy_day.retain(|&known, _| known >= today);
            let statement = match self.client.query_opt(WHOLE_DAY, &[&day]).await? {
                Some(row) => {
                    let table: String = row.get(0);
                    let copy =
                        format!("COPY {table} (code, clicked_at) FROM STDIN (FORMAT binary)");
                    Some((self.client.prepare(&copy).await?, table))
                }
                None => None,
            };
            self.copy_day.insert(day, statement);
        }
        Ok(match &self.copy_day[&day] {
            Some((statement, table)) => (statement.clone(), Some(table.clone())),
            None => (self.copy_clicks.clone(), None),
        })
    }
}

/// Why a day's clicks, just COPYed in `tx`, must wait, if they must: `unroutable` of them
/// were refused for want of a partition and the day is not over (`not_over`: its partition
/// is still to be made), or `partition`, which they went straight into, is one no more
/// (detached by hand since this connection learnt it; asked in the transaction, after the
/// COPY's lock).
async fn must_wait(
    tx: &tokio_postgres::Transaction<'_>,
    attached: &Statement,
    partition: &Option<String>,
    not_over: bool,
    unroutable: usize,
) -> Result<Option<String>, tokio_postgres::Error> {
    if not_over && unroutable > 0 {
        return Ok(Some(format!(
            "{unroutable} clicks of a day not over yet have no partition (the partitions task \
             makes it, unless a table holds its name: collector_partitions_blocked)"
        )));
    }
    let Some(table) = partition else {
        return Ok(None);
    };
    let attached: bool = tx.query_one(attached, &[table]).await?.get(0);
    Ok((!attached).then(|| format!("{table} is no longer a partition of clicks")))
}

/// COPYs the click rows `clicks` of `buf` (all of one UTC day), each range under a
/// savepoint, halving a range that PostgreSQL refuses for good until single rows are left:
/// those are returned, by index, with the error, and how many were refused for want of a
/// partition. A range refused for want of a partition is refused whole, not halved: partitions
/// hold whole days, so none of its rows has one, and halving it down to each row cost two
/// savepoints and COPYs a row, past the attempt's timeout for a large batch, every attempt.
/// (The day partitioning began on is split between two partitions; with one of them gone, its
/// rows that the other would take are set aside too.) Any other error ends the attempt.
/// Rows in `known` (refused by attempts before) are returned as refused without being tried;
/// each row found refused for itself is added to it as it is found, so that an attempt cut
/// off by its deadline leaves what it found to the next: once the table is seen to take rows,
/// a range of this day's or, at the first row refused, the `probe`'s click (before, it may be
/// refusing everything, for a while: then the rows found are not bad rows).
async fn sift_in(
    tx: &mut tokio_postgres::Transaction<'_>,
    statement: &Statement,
    buf: &Bytes,
    clicks: &[copy::ClickRow<'_>],
    known: &mut Vec<(usize, String)>,
    probe: Probing<'_>,
) -> Result<(Vec<(usize, String)>, usize), tokio_postgres::Error> {
    let mut refused = known.clone();
    let skipped: HashSet<usize> = known.iter().map(|(i, _)| *i).collect();
    let tried: Vec<usize> = (0..clicks.len()).filter(|i| !skipped.contains(i)).collect();
    let mut unroutable = 0;
    // Found before the table took any range: remembered once it does.
    let mut unsure: Vec<(usize, String)> = Vec::new();
    // A probe or a range taken for another day of this attempt already says the table takes
    // rows.
    let (mut taken, mut probes) = (probe.probe.taken, 0);
    // A stack of ranges of `tried` still to try, all of it first.
    let mut ranges = Vec::new();
    ranges.push(0..tried.len());
    let mut sifted = Sifted::begin(tx, statement, buf, clicks).await?;
    while let Some(range) = ranges.pop() {
        if range.is_empty() {
            continue;
        }
        sifted.trying(tx).await?;
        match copy_in(tx, statement, rows_of(buf, clicks, &tried[range.clone()])).await {
            Ok(_) => {
                sifted.took(tx, range.map(|at| tried[at])).await?;
                known.append(&mut unsure);
                taken = true;
                probe.probe.taken = true;
            }
            Err(e) if refuses_rows(&e) => {
                sifted.refused(tx).await?;
                let unroutable_here = no_partition(&e);
                if range.len() == 1 || unroutable_here {
                    let why = describe(&e);
                    let found = range.clone().map(|at| (tried[at], why.clone()));
                    if !unroutable_here && !taken && probes < PROBES_A_DAY {
                        probes += 1;
                        taken = takes(tx, probe.copy_clicks, probe.probe, clicks).await?;
                    }
                    if unroutable_here {
                        unroutable += range.len();
                    } else if taken {
                        known.extend(found.clone());
                    } else {
                        unsure.extend(found.clone());
                    }
                    refused.extend(found);
                } else {
                    let mid = range.start + range.len() / 2;
                    ranges.push(mid..range.end);
                    ranges.push(range.start..mid);
                }
            }
            Err(e) => return Err(e),
        }
    }
    sifted.finish(tx).await?;
    Ok((refused, unroutable))
}

/// The probes a day's sift tries at most, each of another code (`takes`), at the first rows
/// it finds refused: with one, a probe's code refused too (an operator's constraint refusing
/// the codes of links gone, say) left every row found unsure, forgotten at the attempt's
/// deadline, and a sift that outlasts one attempt began again at every attempt, for good.
const PROBES_A_DAY: usize = 3;

/// Savepoint levels of a sift ([`Sifted`]), and what each takes before it is rolled back and
/// COPYed again as one.
const LEVELS: usize = 4;
const FANOUT: usize = 12;
/// The most subtransactions a sift keeps live at once: `sifting` and the levels, the closed
/// levels each of them holds but the innermost, and the innermost's ranges (the probe's comes
/// when it holds fewer). Under the 64 PostgreSQL caches, with room for the days before it in
/// the batch: a day sifted keeps none, a day taken whole one.
const LIVE_MOST: usize = 1 + LEVELS + (LEVELS - 1) * (FANOUT - 1) + FANOUT;
const _: () = assert!(LIVE_MOST <= 50);

/// The rows a sift ([`sift_in`]) took, and the subtransactions they are in. Each range taken
/// is one, which the transaction keeps until it ends, and PostgreSQL caches 64 per backend:
/// past them, every snapshot in the cluster is taken the slow way until the transaction ends
/// (rolled back, they are forgotten; the overflow is not). The whole day is tried first, under
/// `sifting` alone: taken, it is COPYed once and keeps one. Refused, the ranges are taken
/// under [`LEVELS`] nested savepoints, as a counter counts: a level that took [`FANOUT`]
/// ranges or levels is rolled back and its rows COPYed again in one statement, one more taken
/// by the level around it (the outermost, by the whole sift); at the end, the whole sift
/// likewise, in the transaction itself, keeping none. Each row taken is COPYed at most five
/// times, and once more for each `FANOUT ^ LEVELS` (20,736) ranges past the first. (Rows go in
/// again as they went in, in order, so a row refused for a row taken before it stays refused.)
struct Sifted<'a> {
    statement: &'a Statement,
    buf: &'a Bytes,
    clicks: &'a [copy::ClickRow<'a>],
    /// Indexes into `clicks`, ascending, as `rows_of` wants them: ranges are tried from the
    /// first row on.
    rows: Vec<usize>,
    /// For each level, innermost first: where its rows begin in `rows`, and what it took.
    levels: [(usize, usize); LEVELS],
    /// Whether the levels are open: the whole day was refused.
    sifting: bool,
}

impl<'a> Sifted<'a> {
    async fn begin(
        tx: &tokio_postgres::Transaction<'_>,
        statement: &'a Statement,
        buf: &'a Bytes,
        clicks: &'a [copy::ClickRow<'a>],
    ) -> Result<Sifted<'a>, tokio_postgres::Error> {
        tx.batch_execute("SAVEPOINT sifting").await?;
        let (rows, levels) = (Vec::new(), [(0, 0); LEVELS]);
        Ok(Sifted {
            statement,
            buf,
            clicks,
            rows,
            levels,
            sifting: false,
        })
    }

    /// A range is about to be tried.
    async fn trying(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
    ) -> Result<(), tokio_postgres::Error> {
        match self.sifting {
            true => tx.batch_execute("SAVEPOINT sift").await,
            false => Ok(()),
        }
    }

    /// The range tried was refused.
    async fn refused(
        &mut self,
        tx: &tokio_postgres::Transaction<'_>,
    ) -> Result<(), tokio_postgres::Error> {
        if self.sifting {
            // Released too: each `ROLLBACK TO` keeps its savepoint, one level deeper a range.
            return tx.batch_execute("ROLLBACK TO sift; RELEASE sift").await;
        }
        tx.batch_execute("ROLLBACK TO sifting").await?;
        self.sifting = true;
        self.open(tx, LEVELS).await
    }

    /// Opens the innermost `n` levels, outermost first.
    async fn open(
        &mut self,
        tx: &tokio_postgres::Transaction<'_>,
        n: usize,
    ) -> Result<(), tokio_postgres::Error> {
        for level in (0..n).rev() {
            tx.batch_execute(&format!("SAVEPOINT sift_{level}")).await?;
            self.levels[level] = (self.rows.len(), 0);
        }
        Ok(())
    }

    /// The range tried was taken: these rows. Full levels are COPYed again, each into the one
    /// around it.
    async fn took(
        &mut self,
        tx: &tokio_postgres::Transaction<'_>,
        rows: impl Iterator<Item = usize>,
    ) -> Result<(), tokio_postgres::Error> {
        self.rows.extend(rows);
        if !self.sifting {
            return Ok(());
        }
        tx.batch_execute("RELEASE sift").await?;
        let mut closed = 0;
        while closed < LEVELS {
            self.levels[closed].1 += 1;
            if self.levels[closed].1 < FANOUT {
                break;
            }
            let (name, from) = (format!("sift_{closed}"), self.levels[closed].0);
            // The outermost's rows go again with the whole sift's, just below.
            if closed + 1 < LEVELS {
                self.copy_again(tx, &name, from).await?;
            }
            tx.batch_execute(&format!("RELEASE {name}")).await?;
            closed += 1;
        }
        if closed == LEVELS {
            self.copy_again(tx, "sifting", 0).await?;
        }
        self.open(tx, closed).await
    }

    /// Rolls back to savepoint `name` and COPYs the rows taken from `rows[from]` on again.
    async fn copy_again(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        name: &str,
        from: usize,
    ) -> Result<(), tokio_postgres::Error> {
        tx.batch_execute(&format!("ROLLBACK TO {name}")).await?;
        if from == self.rows.len() {
            return Ok(());
        }
        let rows = rows_of(self.buf, self.clicks, &self.rows[from..]);
        copy_in(tx, self.statement, rows).await.map(drop)
    }

    /// Ends the sift. A sifted day's levels (which all have xids once anything below them
    /// wrote, the probe's click included) are rolled back and its rows taken COPYed again as
    /// one, in the transaction itself, so that it keeps no subtransaction (a batch sifts each
    /// of its days); a day taken whole keeps its savepoint's.
    async fn finish(
        self,
        tx: &tokio_postgres::Transaction<'_>,
    ) -> Result<(), tokio_postgres::Error> {
        if !self.sifting {
            return tx.batch_execute("RELEASE sifting").await;
        }
        tx.batch_execute("ROLLBACK TO sifting; RELEASE sifting")
            .await?;
        if self.rows.is_empty() {
            return Ok(());
        }
        let rows = rows_of(self.buf, self.clicks, &self.rows);
        copy_in(tx, self.statement, rows).await.map(drop)
    }
}

/// What [`sift_in`] tries a probe with.
struct Probing<'a> {
    copy_clicks: &'a Statement,
    probe: &'a mut Probe,
}

/// The rows `at` (indexes into `clicks`, ascending) of `buf`: a slice of it where they follow
/// each other, else copied together.
fn rows_of(buf: &Bytes, clicks: &[copy::ClickRow<'_>], at: &[usize]) -> Bytes {
    let (first, last) = (at[0], at[at.len() - 1]);
    if last - first + 1 == at.len() {
        return buf.slice(clicks[first].bytes.start..clicks[last].bytes.end);
    }
    let mut rows = BytesMut::new();
    for &i in at {
        rows.extend_from_slice(&buf[clicks[i].bytes.clone()]);
    }
    rows.freeze()
}

/// Whether `clicks` takes a click of the probe's code now, by `copy_clicks` (in a savepoint,
/// rolled back: nothing of it stays), unless that code is one of `batch`'s: then, as
/// without one, of [`another_code`]; `false` if there is none. A code refused is forgotten
/// as the probe's and not tried again in this attempt; one taken is the probe's (the next
/// batch's too), and answers for the rest of the attempt.
async fn takes(
    tx: &mut tokio_postgres::Transaction<'_>,
    copy_clicks: &Statement,
    probe: &mut Probe,
    batch: &[copy::ClickRow<'_>],
) -> Result<bool, tokio_postgres::Error> {
    if probe.taken {
        return Ok(true);
    }
    let codes: HashSet<&str> = batch.iter().map(|row| row.code).collect();
    // Kept as the probe's when it is one of this batch's: it may be no other's.
    let carried = (probe.code.clone()).filter(|code| !codes.contains(code.as_str()));
    let code = match carried {
        Some(code) => code,
        None => match another_code(tx, probe, &codes).await? {
            Some(code) => code,
            None => return Ok(false),
        },
    };
    let mut row = BytesMut::new();
    copy::put_click(&mut row, &code, protocol::now_us());
    tx.batch_execute("SAVEPOINT probe").await?;
    let taken = match copy_in(tx, copy_clicks, row.freeze()).await {
        Ok(_) => true,
        Err(e) if refuses_rows(&e) => false,
        Err(e) => return Err(e),
    };
    tx.batch_execute("ROLLBACK TO probe; RELEASE probe").await?;
    probe.taken = taken;
    if taken {
        probe.code = Some(code);
    } else {
        if probe.code.as_ref() == Some(&code) {
            probe.code = None;
        }
        probe.refused.push(code);
    }
    Ok(taken)
}

/// A code to probe, neither `batch`'s nor refused in this attempt: the first of click_counts'
/// codes after `probe.after`, in order (its key's), round again from the first past the last.
/// A look reads at most [`LOOK_STEPS`] steps of [`WALK_STEP`] codes (each code once, however
/// many days it has): `None` if they hold none, and the next look goes on after them. Where
/// the walk has been round all of them and found none (nothing folded, or only the batch's
/// codes), one that `clicks` holds ([`A_CODE_TAKEN`]).
async fn another_code(
    tx: &tokio_postgres::Transaction<'_>,
    probe: &mut Probe,
    batch: &HashSet<&str>,
) -> Result<Option<String>, tokio_postgres::Error> {
    let done = probe.fruitless.as_ref().is_some_and(|f| f.done);
    for _ in 0..LOOK_STEPS {
        if done {
            break;
        }
        let from = probe.fruitless.as_ref().map(|f| f.from.as_str());
        let wrapped = probe.fruitless.as_ref().is_some_and(|f| f.wrapped);
        let step = tx
            .query(WALK_AFTER, &[&probe.after, &WALK_STEP, &from])
            .await?;
        let mut round = false;
        for row in &step {
            let code: &str = row.try_get(0)?;
            if !batch.contains(code) && !probe.refused.iter().any(|r| r == code) {
                probe.after = code.to_owned();
                probe.fruitless = None;
                return Ok(Some(code.to_owned()));
            }
            round |= wrapped && row.try_get::<_, Option<bool>>(1)? == Some(true);
        }
        let fruitless = probe.fruitless.get_or_insert_with(|| Fruitless {
            from: probe.after.clone(),
            ..Fruitless::default()
        });
        if let Some(last) = step.last() {
            probe.after = last.try_get(0)?;
        }
        if !round && step.len() < WALK_STEP as usize {
            // The end: round again from the first, once.
            round = fruitless.wrapped;
            fruitless.wrapped = true;
            probe.after.clear();
        }
        if round {
            fruitless.done = true;
            break;
        }
    }
    if !probe.fruitless.as_ref().is_some_and(|f| f.done) {
        return Ok(None);
    }
    let mut code = scan(tx, probe, batch).await?;
    if code.is_none() && !probe.scanned.is_empty() {
        // Every code left was tried at an earlier attempt: round again, at once.
        probe.scanned.clear();
        code = scan(tx, probe, batch).await?;
    }
    match &code {
        Some(code) if probe.scanned.len() < SCANNED_AT_MOST => probe.scanned.push(code.clone()),
        _ => probe.scanned.clear(),
    }
    Ok(code)
}

/// A code of `clicks` ([`A_CODE_TAKEN`]) neither `batch`'s nor refused in this attempt nor
/// tried at an earlier one (`scanned`).
async fn scan(
    tx: &tokio_postgres::Transaction<'_>,
    probe: &Probe,
    batch: &HashSet<&str>,
) -> Result<Option<String>, tokio_postgres::Error> {
    let mut not: Vec<&str> = batch.iter().copied().collect();
    let ruled_out = probe.refused.iter().chain(&probe.scanned);
    not.extend(ruled_out.map(String::as_str));
    let row = tx.query_opt(A_CODE_TAKEN, &[&not]).await?;
    row.map(|row| row.try_get(0)).transpose()
}

/// The codes of `clicks` a batch's attempts pass over at most ([`Probe::scanned`]): about a
/// megabyte, sent with each look.
const SCANNED_AT_MOST: usize = 10_000;

/// Whether PostgreSQL found no partition to route a row to: a check violation that names no
/// constraint (a CHECK constraint's violation names it), raised where rows are routed (its
/// source function, `ExecFindPartition` in every release since 11): not one a trigger
/// raises, whatever table it names.
fn no_partition(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        *db.code() == tokio_postgres::error::SqlState::CHECK_VIOLATION
            && db.constraint().is_none()
            && db.routine() == Some("ExecFindPartition")
    })
}

/// What a batch with refused clicks writes besides its clicks.
struct Kept {
    /// `click_count_lists` and `click_breakdown_lists` rows of the clicks written.
    counts: Bytes,
    breakdowns: Bytes,
    /// `clicks_set_aside` rows: the batch's own and the refused clicks, with their errors.
    set_aside: Bytes,
}

/// The counts and breakdowns of the clicks that were written (`clicks`, each with its
/// `dimensions`, but those `refused`), and the set-aside rows.
fn without_refused(
    tag: copy::BatchTag,
    clicks: &[copy::ClickRow<'_>],
    dimensions: &[Option<protocol::dimensions::Dimensions<'_>>],
    refused: &[(usize, String)],
    set_aside: &Bytes,
) -> Kept {
    let mut aside = BytesMut::from(&set_aside[..]);
    for (i, error) in refused {
        let row = &clicks[*i];
        copy::put_set_aside(
            &mut aside,
            row.code,
            row.at_us,
            SetAside::Refused.as_str(),
            Some(error),
        );
    }
    let refused: HashSet<usize> = refused.iter().map(|(i, _)| *i).collect();
    let written = || {
        clicks
            .iter()
            .zip(dimensions)
            .enumerate()
            .filter(|(i, _)| !refused.contains(i))
            .map(|(_, (row, d))| (row, *d))
    };
    let breakdowns = written().filter_map(|(row, d)| Some((row.code, row.at_us, d?)));
    Kept {
        counts: copy::count_rows(tag, written().map(|(row, _)| (row.code, row.at_us))),
        breakdowns: copy::breakdowns_of(tag, breakdowns),
        set_aside: aside.freeze(),
    }
}

/// The most bytes of a COPY sent as one message. tokio-postgres sends each buffer it is fed as
/// a message, and PostgreSQL takes none over 1 GiB: a batch's breakdown rows with every code
/// distinct pass that, and each attempt at it would fail the same way. Rows span messages
/// freely; small enough that every test writing a few thousand rows spans several.
const COPY_MESSAGE: usize = 64 << 10;

/// `rows` as the messages of a COPY: slices of at most `COPY_MESSAGE` bytes (no copy).
fn in_messages(rows: Bytes) -> impl Iterator<Item = Bytes> {
    (0..rows.len())
        .step_by(COPY_MESSAGE)
        .map(move |at| rows.slice(at..rows.len().min(at + COPY_MESSAGE)))
}

/// COPYs `rows` (encoded rows, no header or trailer) in binary; returns the row count.
async fn copy_in(
    tx: &tokio_postgres::Transaction<'_>,
    statement: &Statement,
    rows: Bytes,
) -> Result<u64, tokio_postgres::Error> {
    let mut sink = pin!(tx.copy_in::<_, Bytes>(statement).await?);
    sink.feed(Bytes::from_static(HEADER)).await?;
    for message in in_messages(rows) {
        sink.feed(message).await?;
    }
    sink.feed(Bytes::from_static(TRAILER)).await?;
    sink.as_mut().finish().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_goes_in_messages_of_a_bounded_size_that_add_up_to_its_rows() {
        let rows = Bytes::from(
            (0..2 * COPY_MESSAGE + 5)
                .map(|i| i as u8)
                .collect::<Vec<_>>(),
        );
        let messages: Vec<Bytes> = in_messages(rows.clone()).collect();
        let sizes: Vec<usize> = messages.iter().map(Bytes::len).collect();
        assert_eq!(sizes, [COPY_MESSAGE, COPY_MESSAGE, 5]);
        assert_eq!(messages.concat(), rows);
        assert_eq!(in_messages(Bytes::new()).count(), 0);
    }

    /// Rows the scans of tables in `plan` (`EXPLAIN ANALYZE`'s text, one loop each) read:
    /// those they returned and those their filter removed; and how many such scans ran.
    fn rows_scanned(plan: &[String]) -> (u64, usize) {
        let number = |line: &str, after: &str| -> u64 {
            let at = line.find(after).map_or(line.len(), |i| i + after.len());
            let digits = line[at..].chars().take_while(char::is_ascii_digit);
            digits.collect::<String>().parse().unwrap_or(0)
        };
        let (mut scanned, mut scans) = (0, 0);
        for (i, line) in plan.iter().enumerate() {
            // A scan `(never executed)` read nothing.
            let table = [
                "Seq Scan",
                "Index Scan",
                "Index Only Scan",
                "Bitmap Heap Scan",
            ];
            let of_a_table = table
                .iter()
                .any(|scan| line.contains(&format!("{scan} on")));
            if let (true, Some(at)) = (of_a_table, line.find("(actual")) {
                scans += 1;
                let actual = &line[at..];
                scanned += number(actual, "rows=");
                // Its details, up to the next node.
                let details = plan[i + 1..].iter().take_while(|l| !l.contains("->"));
                if let Some(removed) = details.into_iter().find(|l| l.contains("Removed by")) {
                    scanned += number(removed, "Filter: ");
                }
            }
        }
        (scanned, scans)
    }

    /// A day's partition is COPYed into straight only if it holds that whole day, whatever the
    /// session's DateStyle and TimeZone: not the day partitioning began on, nor a day whose
    /// bounds are shifted (made before migration 24 under settings that shifted them, or
    /// next to such a day), whose clicks outside it a COPY into it would refuse.
    #[tokio::test]
    async fn only_a_partition_holding_its_whole_day_is_copied_into_straight() {
        let db = testkit::pgtest::test_db().await;
        let client = testkit::pgtest::connect(&db.url).await;
        let shifted = "CREATE TABLE clicks_p20300701 PARTITION OF clicks
                           FOR VALUES FROM ('2030-07-01 03:30Z') TO ('2030-07-02Z');
                       SELECT ensure_click_partition(date '2030-07-03');
                       SET DateStyle = 'SQL, DMY'; SET TimeZone = 'Asia/Kolkata'";
        client.batch_execute(shifted).await.unwrap();
        let mut found = Vec::new();
        for day in ["2030-07-01", "2030-07-03"] {
            let n = format!("SELECT (date '{day}' - date '2000-01-01')::int");
            let n: i32 = client.query_one(&n, &[]).await.unwrap().get(0);
            let row = client.query_opt(WHOLE_DAY, &[&n]).await.unwrap();
            found.push(row.map(|r| r.get::<_, String>(0)));
        }
        assert_eq!(found, [None, Some("clicks_p20300703".to_owned())]);
    }

    /// A fresh database whose `clicks` has a partition for 1990-01-01, and `sql` run on it.
    async fn with_a_day_of_1990(sql: &str) -> (testkit::pgtest::TestDb, tokio_postgres::Client) {
        let db = testkit::pgtest::test_db().await;
        let client = testkit::pgtest::connect(&db.url).await;
        let day = "CREATE TABLE clicks_p19900101 PARTITION OF clicks
                       FOR VALUES FROM ('1990-01-01Z') TO ('1990-01-02Z');";
        client.batch_execute(&format!("{day} {sql}")).await.unwrap();
        (db, client)
    }

    /// The probe's looks walk click_counts' codes in order, each once (whatever its days),
    /// leaving out the batch's, round again past the last, a bounded number a look; with none
    /// folded, or a round of the batch's codes only, a code of clicks.
    #[tokio::test]
    async fn the_looks_for_a_probe_code_walk_the_folded_codes_round() {
        let sql = "INSERT INTO clicks VALUES ('unfolded', '1990-01-01Z')";
        let (_db, mut client) = with_a_day_of_1990(sql).await;
        let mut probe = Probe::default();
        let batch = || HashSet::from(["b"]);
        let tx = client.transaction().await.unwrap();
        let found = another_code(&tx, &mut probe, &batch()).await.unwrap();
        assert_eq!(found.as_deref(), Some("unfolded"), "nothing folded yet");
        // The batch's later looks pass over the codes of clicks tried, and once none is left,
        // begin again at once.
        let again = another_code(&tx, &mut probe, &batch()).await.unwrap();
        assert_eq!(
            again.as_deref(),
            Some("unfolded"),
            "clicks' codes round again"
        );
        assert_eq!(probe.scanned, ["unfolded"]);
        // Round for this batch: the next batch's walk starts afresh.
        probe = Attempts::with_probe(probe).probe;
        tx.batch_execute(
            "INSERT INTO click_counts VALUES ('a', '1990-01-01', 1), ('a', '1990-01-02', 1),
                 ('b', '1990-01-01', 1), ('c', '1990-01-01', 1), ('d', '1990-01-01', 1)",
        )
        .await
        .unwrap();
        let mut walked = Vec::new();
        for _ in 0..5 {
            walked.push(
                another_code(&tx, &mut probe, &batch())
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        assert_eq!(walked, ["a", "c", "d", "a", "c"]);
        // The code the walk stands on is the one left: it is found as the round ends.
        let found = another_code(&tx, &mut probe, &HashSet::from(["a", "b", "d"])).await;
        assert_eq!(found.unwrap().as_deref(), Some("c"), "the code it stood on");
        let all = HashSet::from(["a", "b", "c", "d"]);
        let found = another_code(&tx, &mut probe, &all).await.unwrap();
        assert_eq!(
            found.as_deref(),
            Some("unfolded"),
            "a round of the batch's codes only"
        );
        // Past a look's steps of the batch's codes alone: none this look, the next goes on.
        let many = "INSERT INTO click_counts SELECT 'b' || lpad(n::text, 5, '0'), '1990-01-01', 1
                    FROM generate_series(0, 9999) AS n";
        tx.batch_execute(many).await.unwrap();
        let bs: Vec<String> = (0..10_000).map(|n| format!("b{n:05}")).collect();
        let mut batch: HashSet<&str> = bs.iter().map(String::as_str).collect();
        batch.extend(["a", "b"]);
        probe = Attempts::with_probe(probe).probe;
        probe.after.clear();
        let first = another_code(&tx, &mut probe, &batch).await.unwrap();
        assert_eq!(first, None, "a look's steps of the batch's codes");
        let next = another_code(&tx, &mut probe, &batch).await.unwrap();
        assert_eq!(next.as_deref(), Some("c"));
        // A round begun mid-table: a code before where it began is found after the wrap.
        batch.extend(["c", "d"]);
        probe = Attempts::with_probe(probe).probe;
        let b02000 = batch.take("b02000").unwrap();
        probe.after = "b05000".into();
        let found = another_code(&tx, &mut probe, &batch).await.unwrap();
        assert_eq!(
            found.as_deref(),
            Some(b02000),
            "found past the end, before the start"
        );
        batch.insert(b02000);
        // A round longer than a look: clicks' code once the walk is past where it began, at
        // the first code after the end.
        probe = Attempts::with_probe(probe).probe;
        probe.after.clear();
        let first = another_code(&tx, &mut probe, &batch).await.unwrap();
        assert_eq!(first, None, "a look of a round longer than one");
        let next = another_code(&tx, &mut probe, &batch).await.unwrap();
        assert_eq!(next.as_deref(), Some("unfolded"), "the round over");
    }

    /// A new attempt forgets the codes refused and a round of the walk done, not one under way.
    #[test]
    fn an_attempt_goes_on_with_a_round_under_way_and_begins_a_done_one_again() {
        let mut probe = Probe {
            refused: vec!["x".into()],
            scanned: vec!["y".into()],
            taken: true,
            fruitless: Some(Fruitless {
                from: "m".into(),
                wrapped: true,
                done: false,
            }),
            ..Probe::default()
        };
        probe.begin_an_attempt();
        assert!(probe.refused.is_empty() && !probe.taken);
        assert_eq!(probe.scanned, ["y"], "the codes of clicks tried");
        let under_way = probe
            .fruitless
            .as_ref()
            .map(|f| (f.from.as_str(), f.wrapped));
        assert_eq!(under_way, Some(("m", true)), "a round under way");
        probe.fruitless.as_mut().unwrap().done = true;
        probe.begin_an_attempt();
        assert!(probe.fruitless.is_none(), "a round done");
    }

    /// A sift that takes hundreds of ranges keeps fewer than PostgreSQL's 64 subtransactions
    /// live at once (seen from inside the transaction) and none to the commit, every row taken
    /// once.
    #[tokio::test]
    async fn a_long_sift_keeps_under_64_subtransactions_live() {
        let (_db, mut client) = with_a_day_of_1990("").await;
        let mut rows = bytes::BytesMut::new();
        for i in 0..300 {
            super::copy::put_click(&mut rows, "c", 631_152_000_000_000 + i);
        }
        let buf = rows.freeze();
        let clicks = super::copy::click_rows(&buf);
        let statement = client.prepare(super::COPY_CLICKS).await.unwrap();
        let tx = client.transaction().await.unwrap();
        let mut sifted = super::Sifted::begin(&tx, &statement, &buf, &clicks)
            .await
            .unwrap();
        // The rows' xmins, each the subtransaction that wrote them (a lower bound: savepoints
        // whose children wrote have xids too, which `LIVE_MOST` counts; a released one's lock
        // on its xid is gone, so `pg_locks` does not show them).
        let xmins = "SELECT count(DISTINCT xmin::text) FROM clicks";
        let mut most = 0;
        // The whole day refused first, as a sift begins; then a range a row.
        sifted.refused(&tx).await.unwrap();
        for i in 0..clicks.len() {
            sifted.trying(&tx).await.unwrap();
            let row = super::rows_of(&buf, &clicks, &[i]);
            super::copy_in(&tx, &statement, row).await.unwrap();
            sifted.took(&tx, std::iter::once(i)).await.unwrap();
            let live: i64 = tx.query_one(xmins, &[]).await.unwrap().get(0);
            most = most.max(live);
        }
        assert!(
            (12..=super::LIVE_MOST as i64).contains(&most),
            "{most} at once"
        );
        sifted.finish(&tx).await.unwrap();
        // Written by the transaction itself, in no subtransaction kept to the commit.
        let own = "SELECT count(*) FROM clicks
                   WHERE xmin::text::int8 <> pg_current_xact_id()::text::int8 % 4294967296";
        let sub: i64 = tx.query_one(own, &[]).await.unwrap().get(0);
        assert_eq!(sub, 0, "rows of a subtransaction");
        tx.commit().await.unwrap();
        let counts = "SELECT count(*), count(DISTINCT xmin::text) FROM clicks";
        let row = client.query_one(counts, &[]).await.unwrap();
        assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (300, 1));
    }

    /// A history holding only the batch's codes for 300,000 rows: the look for a probe's code
    /// in `clicks` reads at most 100,000 of them (it read all of them, and outlived the
    /// attempt), and finds none; the code past them is for a later look to find.
    #[tokio::test]
    async fn the_look_for_a_probe_code_reads_a_bounded_part_of_the_history() {
        let (_db, client) = with_a_day_of_1990(
            "INSERT INTO clicks (code, clicked_at)
             SELECT 'few', '1990-01-01Z' FROM generate_series(1, 300000);
             INSERT INTO clicks VALUES ('other', '1990-01-01Z');
             ANALYZE clicks_p19900101;
             SET max_parallel_workers_per_gather = 0",
        )
        .await;
        let not = vec!["few", "poison"];
        let found = client
            .query_opt(super::A_CODE_TAKEN, &[&not])
            .await
            .unwrap();
        assert_eq!(found.map(|row| row.get::<_, String>(0)), None);
        let explain = format!("EXPLAIN (ANALYZE, COSTS OFF) {}", super::A_CODE_TAKEN);
        let plan: Vec<String> = client
            .query(&explain, &[&not])
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        let (scanned, scans) = rows_scanned(&plan);
        assert!(scans > 0, "no scan found in {plan:#?}");
        assert!(scanned <= 100_002, "read {scanned} rows: {plan:#?}");
    }
}
