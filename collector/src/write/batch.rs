//! One batch being filled: its clicks already encoded as binary COPY rows, its counts per
//! (code, UTC day) and per (code, UTC day, dimension, value), the highest seq of each sender in
//! it, and the clicks it sets aside.

use std::collections::HashMap;

use bytes::{BufMut, Bytes, BytesMut};
use nix::sys::socket::UnixAddr;
use protocol::dimensions::{Agent, Country, Device, Dimension, Dimensions};
use shared::metrics::Label;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::write::code_map::{self, CodeMap};
use crate::write::copy;

/// Clicks per UTC day (PostgreSQL's day number), then per code.
pub(crate) type CodeCounts = HashMap<i32, Counts, FastHash>;
/// One day's clicks per code.
pub(crate) type Counts = CodeMap<i64>;
/// The maps keyed by day (and dimension): a few keys, looked up once a click (and dimension).
type FastHash = foldhash::fast::RandomState;
/// A batch's clicks per UTC day, then per code, by agent: the agent's breakdown is counted by
/// the same lookup as the code's total (every click has an agent), not by a second map. A
/// list, not a map: a batch spans a day, two around midnight (late clicks, within
/// `--max-click-age`, a few more).
type Tallies = Vec<(i32, DayTallies)>;
type DayTallies = CodeMap<Tally>;

/// One (day, dimension)'s breakdown: (code, value, clicks) entries.
type BreakdownList<'a> = (i32, Dimension, Vec<(&'a str, &'a str, i64)>);

/// One code's clicks on one day, per agent (`Agent as usize`).
#[derive(Debug, Default, Clone, Copy)]
struct Tally([u32; Agent::ALL.len()]);

impl Tally {
    fn clicks(&self) -> i64 {
        self.0.iter().map(|&n| i64::from(n)).sum()
    }
}
/// Clicks per (UTC day, dimension), then per `"code value"` key: one flat map of the same kind
/// as a day's code counts, looked up by a key written into a reused buffer, so that counting a
/// click's dimensions costs a lookup each and allocates only for a key new to the batch (and
/// longer than 24 bytes). A space never occurs in a code nor in a value (migration 14).
type BreakdownCounts = HashMap<(i32, Dimension), Counts, FastHash>;
/// Emptied breakdown maps kept for the next batch: four dimensions on each of two days.
const SPARE_BREAKDOWNS: usize = 2 * Dimension::ALL.len();

/// Which clicks go into `clicks`: those dated within this window around the collector's clock
/// when it received them. The others are set aside, so that a wrong clock or a forged datagram
/// cannot write into a day long gone (or far ahead), nor into a day without a partition.
#[derive(Debug, Clone, Copy)]
pub struct DateWindow {
    pub max_age_us: i64,
    pub max_skew_us: i64,
}

impl DateWindow {
    /// Why a click at `at_us`, received at `now_us`, is set aside; `None` if it is not.
    pub(crate) fn judge(&self, at_us: i64, now_us: i64) -> Option<SetAside> {
        if at_us < now_us.saturating_sub(self.max_age_us) {
            Some(SetAside::TooOld)
        } else if at_us > now_us.saturating_add(self.max_skew_us) {
            Some(SetAside::TooNew)
        } else {
            None
        }
    }
}

shared::label! {
    /// Why a click was set aside (`clicks_set_aside.reason`, and the metrics label).
    pub(crate) enum SetAside: "reason" {
        TooOld = "too_old",
        TooNew = "too_new",
        /// PostgreSQL refused its row for good (a data or constraint error); `store` finds it.
        Refused = "refused",
    }
}

/// A batch's breakdowns, kept as its counts are, with spare maps.
#[derive(Debug, Default)]
struct Breakdowns {
    counts: BreakdownCounts,
    spare: Vec<Counts>,
    /// The `"code value"` key being looked up, reused from click to click.
    key: String,
}

/// One UTC day's clicks of a batch being filled.
#[derive(Debug)]
struct Day {
    /// PostgreSQL's day number.
    day: i32,
    /// `clicks` COPY rows, without header and trailer.
    rows: BytesMut,
    /// Each of those clicks' dimensions, in the same order ([`log_dimensions`]): only read when
    /// PostgreSQL refuses some of the rows, to leave the refused clicks out of the breakdowns
    /// as they are left out of the counts. A few bytes appended per click, no allocation.
    dimensions: BytesMut,
}

/// The UTC day a push is counting on, and where its rows and counts are in the batch: a
/// datagram's clicks are mostly of one day, so the day is worked out (a division) and looked
/// up once for them, not once a click.
#[derive(Debug, Clone, Copy)]
struct OnDay {
    day: i32,
    /// The day's microseconds, `from_us..to_us`.
    from_us: i64,
    to_us: i64,
    /// Its place in `Batch::rows` and in `Batch::counts`.
    rows: usize,
    counts: usize,
}

impl OnDay {
    fn holds(&self, at_us: i64) -> bool {
        (self.from_us..self.to_us).contains(&at_us)
    }
}

/// One UTC day's clicks of a batch, taken out of it for the writer.
#[derive(Debug)]
pub(crate) struct DayRows {
    pub(crate) day: i32,
    pub(crate) rows: Bytes,
    pub(crate) dimensions: Bytes,
}

/// Clicks a batch's sender records pass over, by the metric each is counted in.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassedOver {
    /// `clicks_rejected`: a datagram rejected whole at the seq its sender was at.
    pub rejected: u64,
    /// `clicks_unaccounted`: skipped by a resync.
    pub unaccounted: u64,
    /// In no metric: what a resync's sender counted past what its skipped datagrams hold,
    /// which a record whose count was short lacked (rows written long before), or which the
    /// sender counts wrong. Passed over all the same, so that a failover that loses the batch
    /// does not count them as lost.
    pub uncounted: u64,
}

#[derive(Debug, Default)]
pub struct Batch {
    /// `clicks` COPY rows per UTC day: each day's go straight into that day's partition
    /// (`store`). A batch spans a day, two around midnight; the buffers are kept from batch to
    /// batch, so their memory is reused.
    rows: Vec<Day>,
    clicks: usize,
    /// `clicks_set_aside` COPY rows, and how many per reason (in `SetAside::ALL` order).
    set_aside_rows: BytesMut,
    set_aside: [u64; <SetAside as Label>::ALL.len()],
    /// Clicks per day, then per code: looked up by `&str`, so a code is copied in only the
    /// first time it appears in a batch (and allocated only if longer than 24 bytes).
    counts: Tallies,
    /// Emptied day maps of earlier batches (at most two), reused for the next days: a map
    /// rebuilt every batch grew by doubling and rehashing each time (a tenth of the
    /// collector's CPU).
    spare_counts: Vec<DayTallies>,
    delta_count: usize,
    /// Clicks per (day, dimension, code, value). Boxed: a batch is moved from task to task by
    /// value, inside events that should stay small.
    breakdowns: Box<Breakdowns>,
    /// Each sender's highest seq in the batch, its clicks up to it since its seq 0, and the
    /// address its acknowledgements go to.
    senders: HashMap<u64, Noted>,
    /// Sender ids the collector forgot: their click_senders rows go with this batch.
    forgotten: Vec<u64>,
    /// Clicks the senders' records in this batch pass over: of datagrams rejected whole, and
    /// those a resync says nobody can account for. Counted once the batch commits, not as
    /// they are passed: a collector killed before that has them passed over again, by its
    /// next process, from the same records.
    passed_over: PassedOver,
    /// The same per sender, all three kinds together: those of a batch that a failover lost
    /// are not counted again (`replication::Committed`).
    passed_over_by: HashMap<u64, u64>,
    /// Each click's time (Unix microseconds), for the commit lag.
    clicked_at: Vec<i64>,
    /// The hashes of the codes of the datagram being pushed, reused from datagram to datagram.
    hashes: Vec<u64>,
    /// When its first datagram arrived.
    started: Option<Instant>,
}

impl Batch {
    /// Adds an accepted datagram's clicks, received at `now_us`: those outside `window` are
    /// set aside.
    pub fn push(
        &mut self,
        datagram: &protocol::wire::Datagram<'_>,
        window: &DateWindow,
        now_us: i64,
    ) {
        // The codes' hashes first, so that the slot and the entry of the codes a few clicks
        // ahead can be asked for while this one is counted (`CodeMap::prefetch_ahead`).
        let mut hashes = std::mem::take(&mut self.hashes);
        hashes.clear();
        hashes.extend(datagram.clicks.iter().map(|c| code_map::hash(c.code)));
        let clicks = datagram.clicks.iter().zip(datagram.clicks_at());
        let mut on: Option<OnDay> = None;
        for (i, (click, (code, at_us))) in clicks.enumerate() {
            if let Some(why) = window.judge(at_us, now_us) {
                copy::put_set_aside(&mut self.set_aside_rows, code, at_us, why.as_str(), None);
                self.set_aside[why as usize] += 1;
                continue;
            }
            let day = match on {
                Some(day) if day.holds(at_us) => day,
                _ => self.on_day_of(at_us),
            };
            on = Some(day);
            let rows = &mut self.rows[day.rows];
            copy::put_click(&mut rows.rows, code, at_us);
            log_dimensions(&mut rows.dimensions, &click.dimensions);
            self.count(code, &hashes, i, day.counts, click.dimensions.agent);
            self.count_dimensions(code, day.day, &click.dimensions);
            self.clicked_at.push(at_us);
            self.clicks += 1;
        }
        self.hashes = hashes;
    }

    /// Clicks set aside, per reason.
    pub(crate) fn set_aside(&self) -> impl Iterator<Item = (SetAside, u64)> + '_ {
        SetAside::ALL.iter().copied().zip(self.set_aside)
    }

    /// The `clicks_set_aside` COPY rows, leaving the buffer empty (see `take_rows`).
    pub(crate) fn take_set_aside_rows(&mut self) -> Bytes {
        self.set_aside_rows.split().freeze()
    }

    /// The UTC day of `at_us`, with its rows and counts made ready.
    fn on_day_of(&mut self, at_us: i64) -> OnDay {
        let day = copy::pg_day(at_us);
        let rows = match self.rows.iter().position(|d| d.day == day) {
            Some(i) => i,
            None => {
                self.rows.push(Day {
                    day,
                    rows: BytesMut::new(),
                    dimensions: BytesMut::new(),
                });
                self.rows.len() - 1
            }
        };
        let counts = match self.counts.iter().position(|&(d, _)| d == day) {
            Some(i) => i,
            None => {
                let codes = self.spare_counts.pop().unwrap_or_default();
                self.counts.push((day, codes));
                self.counts.len() - 1
            }
        };
        let span = copy::day_span(at_us);
        OnDay {
            day,
            from_us: span.start,
            to_us: span.end,
            rows,
            counts,
        }
    }

    /// Counts a click of `code`, the `i`th of a datagram whose codes hash to `hashes`, in
    /// `self.counts[at]`, and asks for what the codes a few clicks on will look up.
    fn count(&mut self, code: &str, hashes: &[u64], i: usize, at: usize, agent: Agent) {
        let codes = &mut self.counts[at].1;
        codes.prefetch_ahead(hashes, i);
        let (tally, new) = codes.slot(code, hashes[i], Tally::default);
        tally.0[agent as usize] += 1;
        self.delta_count += usize::from(new);
    }

    /// Counts the click of `code` on `day` under each dimension it carries.
    fn count_dimensions(&mut self, code: &str, day: i32, dimensions: &Dimensions<'_>) {
        let Breakdowns { counts, spare, key } = &mut *self.breakdowns;
        // The agent is in the code's tally (`count`).
        for (dimension, value) in dimensions.recorded() {
            let values = counts
                .entry((day, dimension))
                .or_insert_with(|| spare.pop().unwrap_or_default());
            key.clear();
            key.push_str(code);
            key.push(' ');
            key.push_str(value);
            *values.slot(key, code_map::hash(key), || 0).0 += 1;
        }
    }

    /// Clicks the records of `sender` in this batch pass over (see `PassedOver`).
    /// Saturating: the counts come from peers (a resync's), and a sum that wrapped would count
    /// a hostile peer's claims as almost nothing.
    pub fn pass_over(&mut self, sender: u64, clicks: PassedOver) {
        let passed = &mut self.passed_over;
        passed.rejected = passed.rejected.saturating_add(clicks.rejected);
        passed.unaccounted = passed.unaccounted.saturating_add(clicks.unaccounted);
        passed.uncounted = passed.uncounted.saturating_add(clicks.uncounted);
        let by = self.passed_over_by.entry(sender).or_default();
        *by = by
            .saturating_add(clicks.rejected)
            .saturating_add(clicks.unaccounted)
            .saturating_add(clicks.uncounted);
    }

    pub(crate) fn passed_over(&self) -> PassedOver {
        self.passed_over
    }

    /// The clicks passed over, per sender: (sender, clicks).
    pub(crate) fn passed_over_by(&self) -> impl ExactSizeIterator<Item = (u64, u64)> + '_ {
        self.passed_over_by
            .iter()
            .map(|(&sender, &clicks)| (sender, clicks))
    }

    /// Sender ids to delete from click_senders with this batch.
    pub fn forget_senders(&mut self, ids: Vec<u64>) {
        self.forgotten.extend(ids);
    }

    /// Keeps, of the ids to delete, those `forgotten` still says are: one forgotten and then
    /// seen again while the batch filled keeps the row its datagrams advance.
    pub(crate) fn forget_only(&mut self, forgotten: impl Fn(u64) -> bool) {
        self.forgotten.retain(|&id| forgotten(id));
    }

    /// The forgotten sender ids as a bigint column (the u64 bits reinterpreted).
    pub(crate) fn forgotten_column(&self) -> Vec<i64> {
        self.forgotten.iter().map(|&id| id as i64).collect()
    }

    /// Records that `sender`'s datagrams up to `seq` are in this batch (or, after a resync,
    /// passed over), `clicks` clicks up to it since its seq 0, sent from where `noted` says;
    /// the highest seq's is kept.
    pub fn note_sender(&mut self, sender: u64, noted: Noted) {
        self.started.get_or_insert_with(Instant::now);
        let last = self.senders.entry(sender).or_insert(noted);
        if (noted.seq, noted.clicks) > (last.seq, last.clicks) {
            *last = noted;
        }
    }

    /// Distinct senders of the batch's datagrams.
    pub(crate) fn senders_len(&self) -> usize {
        self.senders.len()
    }

    /// Each click's time, in Unix microseconds.
    pub(crate) fn clicked_at(&self) -> &[i64] {
        &self.clicked_at
    }

    /// Clicks in the batch for `clicks` (not those set aside).
    pub(crate) fn len(&self) -> usize {
        self.clicks
    }

    /// Clicks of the batch in all: for `clicks`, and set aside.
    pub fn received(&self) -> usize {
        self.clicks + self.set_aside.iter().sum::<u64>() as usize
    }

    /// When its first datagram arrived; `None` while there is nothing to commit. A datagram
    /// without clicks counts: its seq must still be committed.
    pub(crate) fn started(&self) -> Option<Instant> {
        self.started
    }

    /// Each day's COPY rows, leaving the buffers empty; their memory is reused by the next
    /// batch once the returned bytes are dropped. A day of no click since the last take is
    /// forgotten.
    pub(crate) fn take_rows(&mut self) -> Vec<DayRows> {
        self.rows.retain(|d| !d.rows.is_empty());
        self.rows
            .iter_mut()
            .map(|d| DayRows {
                day: d.day,
                rows: d.rows.split().freeze(),
                dimensions: d.dimensions.split().freeze(),
            })
            .collect()
    }

    /// Distinct (code, day) pairs: the entries this batch adds to click_count_lists.
    pub(crate) fn delta_count(&self) -> usize {
        self.delta_count
    }

    /// The batch's counts as `click_count_lists` COPY rows: one per UTC day, its codes and
    /// their counts in two lists.
    pub(crate) fn count_rows(&self, tag: copy::BatchTag) -> Bytes {
        let days = self.counts.iter().map(|&(day, ref codes)| {
            let entries = codes
                .iter()
                .map(|(code, _, t)| (code, t.clicks()))
                .collect();
            (day, entries)
        });
        copy::counts_rows(tag, days)
    }

    /// How many `click_count_lists` rows [`Batch::count_rows`] makes: one per day.
    pub(crate) fn count_row_count(&self) -> usize {
        self.counts.len()
    }

    /// The batch's breakdowns as `click_breakdown_lists` COPY rows: one per (UTC day,
    /// dimension), its codes, values and counts in three lists.
    pub(crate) fn breakdown_rows(&self, tag: copy::BatchTag) -> Bytes {
        copy::breakdown_rows(tag, self.breakdown_lists())
    }

    /// The batch's breakdowns: (day, dimension, its (code, value, clicks) entries).
    fn breakdown_lists(&self) -> impl Iterator<Item = BreakdownList<'_>> {
        let agents = self.counts.iter().map(|&(day, ref codes)| {
            let entries = codes.iter().flat_map(|(code, _, tally)| {
                let by_agent = Agent::ALL.iter().zip(tally.0);
                by_agent
                    .filter(|&(agent, n)| n > 0 && copy::stored(Dimension::Agent, agent.as_str()))
                    .map(move |(agent, n)| (code, agent.as_str(), i64::from(n)))
            });
            (day, Dimension::Agent, entries.collect())
        });
        let others = self
            .breakdowns
            .counts
            .iter()
            .map(|(&(day, dimension), values)| {
                let entries = values
                    .iter()
                    .map(|(key, _, &n)| {
                        // Every key was written as "code value", and a code holds no space.
                        let (code, value) = key.split_once(' ').unwrap_or((key, ""));
                        (code, value, n)
                    })
                    .collect();
                (day, dimension, entries)
            });
        agents.chain(others)
    }

    /// Per UTC day (PostgreSQL's date), (code, its [`code_map::hash`], clicks) per distinct code.
    pub(crate) fn deltas(
        &self,
    ) -> impl Iterator<Item = (i32, impl Iterator<Item = (&str, u64, i64)> + Clone)> {
        self.counts.iter().map(|&(day, ref codes)| {
            let deltas = codes.iter().map(|(code, hash, t)| (code, hash, t.clicks()));
            (day, deltas)
        })
    }

    /// Each sender in the batch with its highest seq.
    pub(crate) fn senders(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.senders
            .iter()
            .map(|(&sender, noted)| (sender, noted.seq))
    }

    /// Each sender in the batch, as noted.
    pub(crate) fn noted(&self) -> impl Iterator<Item = (u64, Noted)> + '_ {
        self.senders.iter().map(|(&sender, &noted)| (sender, noted))
    }

    /// The batch's senders as `click_senders` columns.
    pub(crate) fn sender_columns(&self) -> SenderColumns {
        let mut columns = SenderColumns::default();
        for (sender, noted) in self.noted() {
            columns.push(sender, &noted);
        }
        columns
    }

    /// Empties the batch, keeping its memory.
    pub fn clear(&mut self) {
        self.rows.iter_mut().for_each(|d| {
            d.rows.clear();
            d.dimensions.clear();
        });
        self.clicks = 0;
        self.set_aside_rows.clear();
        self.set_aside = Default::default();
        for (_, mut codes) in self.counts.drain(..) {
            // Two: a batch spans a day, two around midnight. Others (late clicks of older
            // days) are rare, and their maps are freed rather than kept at their size.
            if self.spare_counts.len() < 2 {
                codes.clear();
                self.spare_counts.push(codes);
            }
        }
        self.delta_count = 0;
        let Breakdowns { counts, spare, .. } = &mut *self.breakdowns;
        for (_, mut values) in counts.drain() {
            if spare.len() < SPARE_BREAKDOWNS {
                values.clear();
                spare.push(values);
            }
        }
        self.senders.clear();
        self.forgotten.clear();
        self.passed_over = PassedOver::default();
        self.passed_over_by.clear();
        self.clicked_at.clear();
        self.started = None;
    }
}

/// No device or no country, in a [`log_dimensions`] record.
const ABSENT: u8 = 0xff;

/// Appends one click's dimensions to a day's log: its agent, device (or [`ABSENT`]), country
/// (two letters, or [`ABSENT`] twice) and referrer (its length, at most 64, then its bytes; or
/// [`ABSENT`]). Read back by [`logged_dimensions`].
fn log_dimensions(buf: &mut BytesMut, d: &Dimensions<'_>) {
    buf.put_u8(d.agent as u8);
    buf.put_u8(d.device.map_or(ABSENT, |device| device as u8));
    buf.put_slice(&d.country.map_or([ABSENT; 2], |c| c.bytes()));
    match d.referrer {
        // The decoder took only referrers of at most MAX_REFERRER_LEN (64) bytes.
        Some(r) => {
            buf.put_u8(r.len() as u8);
            buf.put_slice(r.as_bytes());
        }
        None => buf.put_u8(ABSENT),
    }
}

/// The dimensions [`log_dimensions`] wrote into `buf`, in order. Stops at anything it did not
/// write.
pub(crate) fn logged_dimensions(buf: &[u8]) -> Vec<Dimensions<'_>> {
    let mut all = Vec::new();
    let mut rest = buf;
    while let [agent, device, c1, c2, referrer_len, tail @ ..] = rest {
        let Some(&agent) = Agent::ALL.get(usize::from(*agent)) else {
            break;
        };
        let device = Device::ALL.get(usize::from(*device)).copied();
        let country = Country::parse(&[*c1, *c2]);
        let (referrer, tail) = match *referrer_len {
            ABSENT => (None, tail),
            len => {
                let len = usize::from(len);
                let Some(host) = tail.get(..len).and_then(|h| std::str::from_utf8(h).ok()) else {
                    break;
                };
                (Some(host), &tail[len..])
            }
        };
        all.push(Dimensions {
            agent,
            referrer,
            device,
            country,
        });
        rest = tail;
    }
    all
}

/// The receiver's ends of the two channels batches travel on: full ones to the writer,
/// emptied ones back.
pub struct Handoff {
    pub full: mpsc::Sender<Batch>,
    pub empty: mpsc::Receiver<Batch>,
}

/// The writer's ends.
pub struct WriterEnds {
    pub(crate) full: mpsc::Receiver<Batch>,
    pub(crate) empty: mpsc::Sender<Batch>,
}

/// The channels, with a second batch waiting in the empty one (the receiver starts with the
/// first). Two batches exist in all, so neither channel ever fills.
pub fn handoff() -> (Handoff, WriterEnds) {
    let (full_tx, full_rx) = mpsc::channel(2);
    let (empty_tx, empty_rx) = mpsc::channel(2);
    let _ = empty_tx.try_send(Batch::default());
    let receiver = Handoff {
        full: full_tx,
        empty: empty_rx,
    };
    let writer = WriterEnds {
        full: full_rx,
        empty: empty_tx,
    };
    (receiver, writer)
}

/// What a batch notes of a sender (`Batch::note_sender`): its datagrams up to `seq`, with
/// `clicks` clicks since its seq 0, sent from `reply` by `uid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Noted {
    pub seq: u64,
    pub clicks: u64,
    pub reply: Option<UnixAddr>,
    pub uid: Option<u32>,
}

impl Noted {
    /// Up to `seq`, `clicks` clicks, from no address known.
    pub fn at(seq: u64, clicks: u64) -> Noted {
        Noted {
            seq,
            clicks,
            reply: None,
            uid: None,
        }
    }

    /// From the address recorded in a `click_senders` row: its `reply_to` in column `at` and
    /// its `reply_uid` in the next ([`recorded_reply`]).
    pub(crate) fn replying(mut self, row: &tokio_postgres::Row, at: usize) -> Noted {
        if let Some((reply, uid)) = recorded_reply(row, at) {
            (self.reply, self.uid) = (Some(reply), uid);
        }
        self
    }
}

/// The address a `click_senders` row records its sender's acknowledgements go to: the
/// socket's path in column `at` (bytea) and the uid that sent from it in the next; none
/// without a path, or with one no socket address can hold.
pub(crate) fn recorded_reply(
    row: &tokio_postgres::Row,
    at: usize,
) -> Option<(UnixAddr, Option<u32>)> {
    use std::os::unix::ffi::OsStrExt;
    let path = row.get::<_, Option<&[u8]>>(at)?;
    let reply = UnixAddr::new(std::ffi::OsStr::from_bytes(path)).ok()?;
    let uid = row
        .get::<_, Option<i64>>(at + 1)
        .and_then(|u| u32::try_from(u).ok());
    Some((reply, uid))
}

/// Senders as `click_senders` columns: ids, highest seqs and clicks up to them as bigint (the
/// u64 bits reinterpreted), where their acknowledgements go (a socket's path, as bytea; NULL
/// for none, or for an address without a path) and the uid seen sending from there.
#[derive(Debug, Default)]
pub(crate) struct SenderColumns {
    pub(crate) senders: Vec<i64>,
    pub(crate) seqs: Vec<i64>,
    pub(crate) clicks: Vec<i64>,
    pub(crate) replies: Vec<Option<Vec<u8>>>,
    pub(crate) uids: Vec<Option<i64>>,
}

impl SenderColumns {
    /// `ADVANCE_SENDERS`'s parameters, the rows marked with `instance`.
    pub(crate) fn params<'a>(
        &'a self,
        instance: &'a String,
    ) -> [&'a (dyn tokio_postgres::types::ToSql + Sync); 6] {
        [
            &self.senders,
            &self.seqs,
            &self.clicks,
            instance,
            &self.replies,
            &self.uids,
        ]
    }

    pub(crate) fn push(&mut self, sender: u64, noted: &Noted) {
        use std::os::unix::ffi::OsStrExt;
        self.senders.push(sender as i64);
        self.seqs.push(noted.seq as i64);
        self.clicks.push(noted.clicks as i64);
        let path = noted.reply.as_ref().and_then(|at| at.path());
        self.replies
            .push(path.map(|p| p.as_os_str().as_bytes().to_vec()));
        self.uids.push(path.and(noted.uid).map(i64::from));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::wire::{Click, Datagram};

    /// Sets nothing aside.
    const OPEN: DateWindow = DateWindow {
        max_age_us: i64::MAX,
        max_skew_us: i64::MAX,
    };

    const DAY: i64 = 86_400_000_000;

    fn datagram(clicks: &[(&'static str, u32)], base_us: i64) -> Datagram<'static> {
        Datagram {
            version: 1,
            sender: 9,
            seq: 0,
            base_us,
            clicks: clicks
                .iter()
                .map(|&(code, offset_us)| Click::new(code, offset_us))
                .collect(),
        }
    }

    #[test]
    fn counts_per_code_and_utc_day() {
        let mut b = Batch::default();
        let midnight = 20_000 * DAY;
        b.push(
            // Across midnight and back, within one datagram.
            &datagram(&[("a", 0), ("a", 1), ("b", 2), ("c", 0)], midnight - 1),
            &OPEN,
            0,
        );
        b.push(&datagram(&[("a", 0)], midnight + 5), &OPEN, 0);
        assert_eq!(b.len(), 5);
        let mut deltas: Vec<_> = b
            .deltas()
            .flat_map(|(d, codes)| codes.map(move |(c, _, n)| (c.to_owned(), d, n)))
            .collect();
        deltas.sort();
        let day = copy::pg_day(midnight);
        assert_eq!(
            deltas,
            [
                ("a".into(), day - 1, 1),
                ("a".into(), day, 2),
                ("b".into(), day, 1),
                ("c".into(), day - 1, 1)
            ]
        );
        assert_eq!(b.delta_count(), 4);
        let rows: Vec<_> = b
            .take_rows()
            .iter()
            .map(|d| (d.day, copy::click_rows(&d.rows).len()))
            .collect();
        assert_eq!(rows, [(day - 1, 2), (day, 3)]);
    }

    /// Each click under each dimension it carries, per day, code and value; a click set aside
    /// under none; the maps kept from batch to batch count only what the batch holds next.
    #[test]
    fn breakdowns_per_day_dimension_code_and_value() {
        let with = |code, offset_us, agent, referrer, device, country: &[u8]| Click {
            code,
            offset_us,
            dimensions: Dimensions {
                agent,
                referrer,
                device,
                country: Country::parse(country),
            },
        };
        let clicks = vec![
            with("a", 0, Agent::Human, Some(""), Some(Device::Mobile), b"DE"),
            with("a", 1, Agent::Bot, Some("x.org"), None, b"de"),
            with("b", 2, Agent::Human, None, Some(Device::Mobile), b""),
            with("a", 3, Agent::Human, Some(""), None, b""),
            // Dated far ahead: set aside, in no breakdown.
            with("a", 2_000_000, Agent::Preview, None, None, b"FR"),
        ];
        let window = DateWindow {
            max_age_us: i64::MAX,
            max_skew_us: 1_000_000,
        };
        let at = 7 * DAY;
        let mut b = Batch::default();
        let mut d = datagram(&[], at);
        d.version = 2;
        d.clicks = clicks;
        b.push(&d, &window, at);
        let got = |b: &Batch| {
            let mut got: Vec<_> = b
                .breakdown_lists()
                .flat_map(|(day, dim, entries)| {
                    entries.into_iter().map(move |(code, value, n)| {
                        (day, dim.as_str(), format!("{code} {value}"), n)
                    })
                })
                .collect();
            got.sort();
            got
        };
        let day = copy::pg_day(at);
        let row = |dim, key: &str, n| (day, dim, key.to_owned(), n);
        assert_eq!(
            got(&b),
            // Humans are not stored: the view derives them from the totals.
            [
                row("agent", "a bot", 1),
                row("country", "a DE", 2),
                row("device", "a mobile", 1),
                row("device", "b mobile", 1),
                row("referrer", "a (none)", 2),
                row("referrer", "a x.org", 1),
            ]
        );
        assert!(!b
            .breakdown_rows(copy::BatchTag {
                writer: 1,
                batch: 1
            })
            .is_empty());
        // The log holds each written click's dimensions, in order.
        let taken = b.take_rows();
        let logged = logged_dimensions(&taken[0].dimensions);
        let want: Vec<_> = d.clicks[..4].iter().map(|c| c.dimensions).collect();
        assert_eq!(logged, want);

        b.clear();
        d.clicks = vec![with("c", 0, Agent::Bot, None, None, b"")];
        b.push(&d, &OPEN, at);
        assert_eq!(got(&b), [row("agent", "c bot", 1)]);

        // Human clicks with no other dimension: nothing to write, so no row and no COPY.
        b.clear();
        d.clicks = vec![with("c", 0, Agent::Human, None, None, b"")];
        b.push(&d, &OPEN, at);
        assert_eq!(got(&b), []);
        let tag = copy::BatchTag {
            writer: 1,
            batch: 2,
        };
        assert!(b.breakdown_rows(tag).is_empty(), "no empty agent row");
    }

    /// The day maps are kept from batch to batch: a refilled batch counts its own clicks
    /// only, on its own days, codes longer than the inline 24 bytes included.
    #[test]
    fn a_cleared_batch_counts_only_what_it_holds_next() {
        let long = "a-code-of-sixty-four-bytes-which-is-longer-than-the-inline-bytes";
        let mut b = Batch::default();
        b.push(&datagram(&[("a", 0), (long, 1)], 3 * DAY), &OPEN, 0);
        b.push(&datagram(&[("a", 0)], 4 * DAY), &OPEN, 0);
        b.clear();
        b.push(
            &datagram(&[(long, 0), (long, 1), ("b", 2)], 5 * DAY),
            &OPEN,
            0,
        );
        let mut deltas: Vec<_> = b
            .deltas()
            .flat_map(|(d, codes)| codes.map(move |(c, _, n)| (c.to_owned(), d, n)))
            .collect();
        deltas.sort();
        let day = copy::pg_day(5 * DAY);
        assert_eq!(deltas, [(long.into(), day, 2), ("b".into(), day, 1)]);
        assert_eq!((b.delta_count(), b.count_row_count()), (2, 1));
    }

    #[test]
    fn clicks_outside_the_window_are_set_aside_by_reason() {
        let window = DateWindow {
            max_age_us: 100,
            max_skew_us: 10,
        };
        let mut b = Batch::default();
        let now = 1_000;
        b.push(
            &datagram(&[("old", 0), ("ok", 100), ("ok", 110), ("new", 112)], 899),
            &window,
            now,
        );
        assert_eq!((b.len(), b.received()), (2, 4));
        let aside: Vec<_> = b.set_aside().map(|(why, n)| (why.as_str(), n)).collect();
        assert_eq!(aside, [("too_old", 1), ("too_new", 1), ("refused", 0)]);
        assert_eq!(b.clicked_at(), [999, 1_009]);
        assert!(!b.take_set_aside_rows().is_empty());
    }

    #[test]
    fn what_peers_say_was_passed_over_adds_up_without_wrapping() {
        let mut b = Batch::default();
        let most = PassedOver {
            rejected: u64::MAX - 1,
            unaccounted: u64::MAX - 1,
            uncounted: u64::MAX - 1,
        };
        b.pass_over(3, most);
        b.pass_over(3, most);
        b.pass_over(4, most);
        let all = PassedOver {
            rejected: u64::MAX,
            unaccounted: u64::MAX,
            uncounted: u64::MAX,
        };
        assert_eq!(b.passed_over(), all);
        assert!(b.passed_over_by().all(|(_, clicks)| clicks == u64::MAX));
    }

    #[test]
    fn keeps_each_senders_highest_seq_and_clears() {
        let mut b = Batch::default();
        let from = |path, seq, clicks| Noted {
            reply: UnixAddr::new(path).ok(),
            uid: Some(7),
            ..Noted::at(seq, clicks)
        };
        b.note_sender(u64::MAX, from("/run/a", 3, 30));
        b.note_sender(u64::MAX, from("/run/b", 2, 20));
        b.note_sender(1, Noted::at(0, 5));
        let c = b.sender_columns();
        let mut rows: Vec<_> = (0..2)
            .map(|i| {
                (
                    c.senders[i],
                    c.seqs[i],
                    c.clicks[i],
                    c.replies[i].clone(),
                    c.uids[i],
                )
            })
            .collect();
        rows.sort();
        let a_path = Some(b"/run/a".to_vec());
        let expected = [(-1, 3, 30, a_path, Some(7)), (1, 0, 5, None, None)];
        assert_eq!(rows, expected, "the highest seq's address");
        assert!(b.started().is_some() && b.received() == 0);
        b.push(&datagram(&[("x", 0)], 0), &OPEN, 0);
        let rows = b.take_rows();
        assert!(!rows.is_empty());
        b.clear();
        assert!(b.started().is_none() && b.deltas().next().is_none());
    }
}
