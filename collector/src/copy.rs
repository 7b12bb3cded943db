//! PostgreSQL's binary COPY format, and the transaction that writes one batch: its claim (the
//! writer's batch number), its clicks, its per-(code, day) counts and its senders' last seq,
//! committed together.

use std::pin::pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::SinkExt;
use tokio_postgres::{Client, Statement};

use crate::batch::{Batch, WriterEnds};
use crate::db::{self, timed, Db, Failure};
use crate::lock;
use crate::metrics::Metrics;

/// Signature, flags (no OIDs) and an empty header extension.
const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";
/// A field count of -1 ends the data.
const TRAILER: &[u8] = &(-1i16).to_be_bytes();
/// 2000-01-01, PostgreSQL's epoch for timestamps and dates, in days since the Unix epoch.
const PG_EPOCH_DAYS: i32 = 10_957;
const DAY_US: i64 = 86_400_000_000;
/// The same epoch in Unix microseconds.
const PG_EPOCH_US: i64 = PG_EPOCH_DAYS as i64 * DAY_US;

const COPY_CLICKS: &str = "COPY clicks (code, clicked_at) FROM STDIN (FORMAT binary)";
const COPY_DELTAS: &str = "COPY click_count_deltas (code, day, clicks) FROM STDIN (FORMAT binary)";
/// Claims the batch's number for this writer (collector process), as the transaction's first
/// statement: the writer's row is inserted, or moved forward only if its committed number is
/// below the batch's, and returned if so. In READ COMMITTED a row (or, for a first batch, a
/// unique-index entry) that an unfinished earlier attempt wrote makes this wait for it and then
/// re-check against what it committed: an orphaned attempt whose COMMIT lands after a retry
/// began is seen by the retry, which then finds no row and does not write the batch twice.
/// Keyed by writer, not by sender: seqs that another collector committed for the same senders
/// (after the writer lock's session was lost) say nothing about whether this batch is in.
const CLAIM_BATCH: &str = "
    INSERT INTO click_writers (writer, last_batch) VALUES ($1, $2)
    ON CONFLICT (writer) DO UPDATE
       SET last_batch = EXCLUDED.last_batch, updated_at = now()
       WHERE click_writers.last_batch < EXCLUDED.last_batch
    RETURNING 1";
/// Moves the batch's senders' committed seqs forward (never back: another collector may have
/// committed later seqs of the same senders), in sender order so that two writers updating the
/// same senders lock their rows in the same order.
const ADVANCE_SENDERS: &str = "
    INSERT INTO click_senders (sender, last_seq, updated_at)
    SELECT sender, last_seq, now() FROM unnest($1::bigint[], $2::bigint[]) AS s(sender, last_seq)
    ORDER BY sender
    ON CONFLICT (sender) DO UPDATE
       SET last_seq = GREATEST(click_senders.last_seq, EXCLUDED.last_seq), updated_at = now()";

/// The UTC day of `at_us` (Unix microseconds), as PostgreSQL's binary `date`.
pub fn pg_day(at_us: i64) -> i32 {
    // Valid clicks lie in years 1..=9999, whose days all fit an i32.
    at_us.div_euclid(DAY_US) as i32 - PG_EPOCH_DAYS
}

/// Appends one `clicks` row: (code text, clicked_at timestamptz).
pub fn put_click(buf: &mut BytesMut, code: &str, at_us: i64) {
    buf.reserve(2 + 4 + code.len() + 4 + 8);
    buf.put_i16(2);
    put_text(buf, code);
    buf.put_i32(8);
    buf.put_i64(at_us - PG_EPOCH_US);
}

/// Appends one `click_count_deltas` row: (code text, day date, clicks bigint).
fn put_delta(buf: &mut BytesMut, code: &str, day: i32, clicks: i64) {
    buf.put_i16(3);
    put_text(buf, code);
    buf.put_i32(4);
    buf.put_i32(day);
    buf.put_i32(8);
    buf.put_i64(clicks);
}

fn put_text(buf: &mut BytesMut, s: &str) {
    // Codes are at most 64 bytes.
    buf.put_i32(s.len() as i32);
    buf.put_slice(s.as_bytes());
}

/// The writer's connection: its session holds the writer lock (`lock`), and its statements
/// are prepared once when it opens.
pub struct Conn {
    client: Client,
    copy_clicks: Statement,
    copy_deltas: Statement,
    claim_batch: Statement,
    advance_senders: Statement,
}

/// What an attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Written,
    /// An earlier attempt had committed it: not written again.
    AlreadyCommitted,
}

impl Conn {
    /// A new connection, once it holds the writer lock; `*waiting` is true while another
    /// session holds it.
    async fn open(db: &Db, waiting: &mut bool) -> Result<Conn, tokio_postgres::Error> {
        let client = db.connect().await?;
        lock::take(&client, waiting).await?;
        Conn::prepare(client).await
    }

    /// Prepares the statements on `client`, whose session must hold the writer lock already.
    pub async fn prepare(client: Client) -> Result<Conn, tokio_postgres::Error> {
        Ok(Conn {
            copy_clicks: client.prepare(COPY_CLICKS).await?,
            copy_deltas: client.prepare(COPY_DELTAS).await?,
            claim_batch: client.prepare(CLAIM_BATCH).await?,
            advance_senders: client.prepare(ADVANCE_SENDERS).await?,
            client,
        })
    }

    /// One transaction: the claim of batch `number`, senders, clicks, deltas, commit; unless
    /// the claim shows that this batch is in already. Dropping it midway rolls it back.
    async fn write(
        &mut self,
        batch: &Batch,
        rows: &Bytes,
        number: BatchNumber,
    ) -> Result<Outcome, tokio_postgres::Error> {
        let tx = self.client.transaction().await?;
        let claimed = tx
            .query_opt(&self.claim_batch, &[&number.writer, &number.batch])
            .await?;
        if claimed.is_none() {
            tx.rollback().await?;
            return Ok(Outcome::AlreadyCommitted);
        }
        let (senders, seqs) = batch.sender_columns();
        tx.execute(&self.advance_senders, &[&senders, &seqs])
            .await?;
        let written = copy_in(&tx, &self.copy_clicks, rows.clone()).await?;
        debug_assert_eq!(written, batch.len() as u64);
        copy_in(&tx, &self.copy_deltas, delta_rows(batch)).await?;
        tx.commit().await?;
        Ok(Outcome::Written)
    }
}

/// Which batch of which writer: each collector process writes as a random writer id and
/// numbers its batches 1, 2, 3, ... in the order it writes them; a retry keeps the number.
#[derive(Debug, Clone, Copy)]
struct BatchNumber {
    writer: i64,
    batch: i64,
}

/// COPYs `rows` (encoded rows, no header or trailer) in binary; returns the row count.
async fn copy_in(
    tx: &tokio_postgres::Transaction<'_>,
    statement: &Statement,
    rows: Bytes,
) -> Result<u64, tokio_postgres::Error> {
    let mut sink = pin!(tx.copy_in::<_, Bytes>(statement).await?);
    sink.feed(Bytes::from_static(HEADER)).await?;
    sink.feed(rows).await?;
    sink.feed(Bytes::from_static(TRAILER)).await?;
    sink.as_mut().finish().await
}

fn delta_rows(batch: &Batch) -> Bytes {
    let mut buf = BytesMut::with_capacity(batch.delta_count() * 40);
    for (code, day, clicks) in batch.deltas() {
        put_delta(&mut buf, code, day, clicks);
    }
    buf.freeze()
}

/// Writes batches one at a time on its own connection, retrying each until it commits.
pub struct Writer {
    db: Db,
    /// This process's writer id in click_writers, and the number of its last batch.
    last: BatchNumber,
    timeout: Duration,
    conn: Option<Conn>,
    metrics: Arc<Metrics>,
}

impl Writer {
    /// A writer that starts on `conn` (opened at start-up) or else opens its own.
    pub fn new(db: Db, timeout: Duration, metrics: Arc<Metrics>, conn: Option<Conn>) -> Writer {
        Writer {
            db,
            last: BatchNumber {
                // Below 2^63: a positive bigint.
                writer: shared::wire::random_sender() as i64,
                batch: 0,
            },
            timeout,
            conn,
            metrics,
        }
    }

    /// Writes the batches that come full and hands each back emptied, until the receiver
    /// closes its end.
    pub async fn run(mut self, mut ends: WriterEnds) {
        tracing::info!("writing as writer {} in click_writers", self.last.writer);
        while let Some(mut batch) = ends.full.recv().await {
            let started = Instant::now();
            let rows = batch.take_rows();
            self.last.batch += 1;
            self.write(&batch, &rows, self.last).await;
            drop(rows);
            let m = &self.metrics;
            m.batch_seconds.observe(started.elapsed());
            m.batches.inc();
            m.clicks_written.add(batch.len() as u64);
            m.pending_clicks.add(-(batch.len() as i64));
            m.deltas_pending.add(batch.delta_count() as i64);
            batch.clear();
            // The receiver is gone only at shutdown, after its last batch.
            let _ = ends.empty.send(batch).await;
        }
    }

    /// Writes `batch` whatever it takes: on any error or timeout it drops the connection,
    /// waits (capped exponential backoff), reconnects and writes the same batch again.
    async fn write(&mut self, batch: &Batch, rows: &Bytes, number: BatchNumber) {
        let mut backoff = db::backoff();
        loop {
            match self.attempt(batch, rows, number).await {
                Ok(outcome) => {
                    if outcome == Outcome::AlreadyCommitted {
                        tracing::info!(
                            "a batch of {} clicks was committed by an attempt whose answer was \
                             lost; not writing it again",
                            batch.len()
                        );
                    }
                    self.metrics.db_reachable.store(true, Relaxed);
                    return;
                }
                Err(waiting @ Failure::LockHeld(_)) => {
                    tracing::info!("{waiting}; asking again on a new connection");
                }
                Err(failure) => {
                    tracing::warn!(
                        "writing a batch of {} clicks: {failure}; retrying on a new connection",
                        batch.len(),
                    );
                    self.metrics.db_errors.inc();
                    self.metrics.db_reachable.store(false, Relaxed);
                }
            }
            self.conn = None;
            backoff.wait().await;
        }
    }

    /// One attempt, on the current connection or a new one, with one deadline for all of it:
    /// connecting, waiting for the writer lock (a connection of an abandoned attempt can hold
    /// it until its last statement ends) and writing.
    async fn attempt(
        &mut self,
        batch: &Batch,
        rows: &Bytes,
        number: BatchNumber,
    ) -> Result<Outcome, Failure> {
        let mut waiting = false;
        let (db, slot) = (&self.db, &mut self.conn);
        let attempt = async {
            let conn = match slot {
                Some(conn) => conn,
                slot => slot.insert(Conn::open(db, &mut waiting).await?),
            };
            conn.write(batch, rows, number).await
        };
        let result = timed(self.timeout, attempt).await;
        match result {
            Err(Failure::Timeout(limit)) if waiting => Err(Failure::LockHeld(limit)),
            result => result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_timestamps_count_from_2000_utc() {
        assert_eq!(pg_day(PG_EPOCH_US), 0);
        assert_eq!(pg_day(PG_EPOCH_US - 1), -1);
        assert_eq!(pg_day(PG_EPOCH_US + DAY_US - 1), 0);
        assert_eq!(pg_day(0), -PG_EPOCH_DAYS);
        let mut buf = BytesMut::new();
        put_click(&mut buf, "ab", PG_EPOCH_US + 5);
        assert_eq!(&buf[..], b"\0\x02\0\0\0\x02ab\0\0\0\x08\0\0\0\0\0\0\0\x05");
    }
}
