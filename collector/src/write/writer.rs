//! The writer task: batches from the receiver, one at a time, onto the writer's own connection
//! (which holds the instance lock), each retried on a new connection until it commits.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

use shared::throttle::Throttle;

use crate::db::{self, describe, timed, Db, Failure};
use crate::metrics::Shared;
use crate::write::batch::SetAside;
use crate::write::batch::{Batch, WriterEnds};
use crate::write::lock;
use crate::write::replication::{Committed, Watch};
use crate::write::store::{refuses_rows, Attempts, BatchNumber, Conn, Probe, Rows, Stored};
use crate::write::unfolded::Unfolded;
use crate::write::Metrics;

/// Writes batches one at a time on its own connection, retrying each until it commits.
pub struct Writer {
    db: Db,
    /// This process's writer id and instance in click_writers, and the number of its last batch.
    last: BatchNumber,
    timeout: Duration,
    conn: Option<Conn>,
    /// The sums of the batches committed and not folded yet, for the maintenance task.
    unfolded: Arc<Unfolded>,
    metrics: Arc<Metrics>,
    shared: Arc<Shared>,
    /// Its sessions' replication: settings, a commit stuck waiting for a standby.
    watch: Arc<Watch>,
    /// What it committed, to find what a failover lost.
    committed: Committed,
    /// What the attempts at the last batch left of their probe (`Attempts::probe`), its code
    /// the first click's of the last batch written whole.
    probe: Probe,
}

impl Writer {
    /// A writer for collector instance `instance`, writing as `unfolded`'s writer id, that
    /// starts on `conn` (opened at start-up, holding the instance lock) or else opens its own.
    pub fn new(
        db: Db,
        instance: &str,
        timeout: Duration,
        unfolded: Arc<Unfolded>,
        metrics: Arc<Metrics>,
        shared: Arc<Shared>,
        conn: Option<Conn>,
    ) -> Writer {
        let watch = Watch::new(metrics.clone());
        Writer {
            db,
            last: BatchNumber {
                writer: unfolded.writer(),
                instance: instance.to_owned(),
                batch: 0,
            },
            timeout,
            conn,
            unfolded,
            metrics,
            shared,
            watch,
            committed: Committed::default(),
            probe: Probe::default(),
        }
    }

    /// Checks its new sessions for the commits of `committed` too (see
    /// [`Committed::of_instance`]), as well as its own.
    pub fn after(mut self, committed: Committed) -> Writer {
        self.committed = committed;
        self
    }

    /// Watched by `watch` (run by its owner, [`Watch::run`]), which start-up's session was
    /// watched by: the writer goes on with that session.
    pub fn watched_by(mut self, watch: Arc<Watch>) -> Writer {
        self.watch = watch;
        self
    }

    /// Writes the batches that come full and hands each back committed (the receiver
    /// acknowledges its senders and empties it), until the receiver closes its end.
    pub async fn run(mut self, mut ends: WriterEnds) {
        tracing::info!(
            writer = self.last.writer,
            instance = %self.last.instance,
            "writing as writer {} of instance {:?} in click_writers",
            self.last.writer,
            self.last.instance
        );
        if let Some(conn) = &self.conn {
            // Timed as every other wait on the database here: a server that stopped answering
            // since start-up would otherwise hold the writer before its first batch for good.
            let connected = timed(self.timeout, self.watch.connected(conn.client()));
            if let Err(failure) = connected.await {
                tracing::warn!("reading the replication settings: {failure}");
                self.shared.counts.db_errors.inc();
                self.conn = None;
            }
        }
        while let Some(mut batch) = ends.full.recv().await {
            let started = Instant::now();
            let rows = Rows {
                clicks: batch.take_rows(),
                set_aside: batch.take_set_aside_rows(),
            };
            self.last.batch += 1;
            let number = self.last.clone();
            // Its lines carry the batch's number, the one click_writers records.
            let span = tracing::info_span!("batch", number = number.batch);
            self.watch.writing();
            self.committed.forget(&batch);
            let mut attempts = Attempts::with_probe(std::mem::take(&mut self.probe));
            let (written, began) = (self.write(&batch, &rows, &number, &mut attempts))
                .instrument(span)
                .await;
            self.probe = attempts.probe;
            self.watch.written();
            let refused = match written {
                Stored::Written { refused } | Stored::AlreadyCommitted { refused } => refused,
                Stored::AllRefused(_) | Stored::Retry(_) => 0,
            };
            self.committed.add(&batch, number.batch, began);
            let whole = matches!(
                written,
                Stored::Written { refused: 0 } | Stored::AlreadyCommitted { refused: 0 }
            );
            if let (true, Some(code)) = (whole, rows.first_code()) {
                let probe = self.probe.code.get_or_insert_with(String::new);
                probe.clear();
                probe.push_str(code);
            }
            drop(rows);
            match written {
                Stored::Written { refused: 0 } => self.unfolded.add(number.batch, &batch),
                // Its counts are not the batch's: the rows will tell.
                _ => self.unfolded.lose(number.batch),
            }
            let m = &self.metrics;
            let now = protocol::now_us();
            let lag = |&at: &i64| Duration::from_micros(now.saturating_sub(at).max(0) as u64);
            m.commit_lag.observe_all(batch.clicked_at().iter().map(lag));
            m.batch_seconds.observe(started.elapsed());
            m.batches.inc();
            m.clicks_written.inc_by(batch.len() as u64 - refused);
            for (why, n) in batch.set_aside() {
                m.clicks_set_aside.add(why, n);
            }
            m.clicks_set_aside.add(SetAside::Refused, refused);
            self.shared
                .counts
                .pending_clicks
                .dec_by(batch.received() as i64);
            // The receiver is gone only at shutdown, after its last batch.
            let _ = ends.empty.send(batch).await;
            self.reread_settings().await;
        }
    }

    /// Reads the session's replication settings again when due (`Watch::settings_due`): a
    /// reload may have changed them since it connected. A session that fails it, or does not
    /// answer within the deadline, is dropped: the next batch would only meet it again.
    async fn reread_settings(&mut self) {
        let Some(conn) = &self.conn else { return };
        if !self.watch.settings_due() {
            return;
        }
        let reread = timed(self.timeout, self.watch.reread(conn.client()));
        if let Err(failure) = reread.await {
            tracing::warn!(
                error = %failure,
                "reading the replication settings again: {failure}; the next batch goes on a \
                 new connection"
            );
            self.shared.counts.db_errors.inc();
            self.conn = None;
        }
    }

    /// Writes `batch` whatever it takes: on any error or timeout it drops the connection,
    /// waits (capped exponential backoff), reconnects and writes the same batch again. Once
    /// PostgreSQL refuses a row for good (`store::refuses_rows`), the attempts sift the rows
    /// to set the refused ones aside. Returns how it went in: written (with how many refused),
    /// or already committed by an attempt whose answer was lost; and when the attempt that
    /// stored it began (the first, if that answer was lost), no later than its transaction.
    /// `attempts` come with the probe the batch before left them, and leave it to the next.
    async fn write(
        &mut self,
        batch: &Batch,
        rows: &Rows,
        number: &BatchNumber,
        attempts: &mut Attempts,
    ) -> (Stored, Instant) {
        let mut backoff = db::backoff();
        let first = Instant::now();
        loop {
            let began = Instant::now();
            let found = attempts.found_refused();
            match self.attempt(batch, rows, number, attempts).await {
                Ok(Stored::Written { refused }) => {
                    if refused > 0 {
                        tracing::warn!(
                            refused,
                            clicks = batch.len(),
                            "{refused} clicks of a batch of {} refused by the database for \
                             good: set aside in clicks_set_aside with the error",
                            batch.len()
                        );
                    }
                    self.shared.health.writes.store(true, Relaxed);
                    return (Stored::Written { refused }, began);
                }
                Ok(Stored::AlreadyCommitted { refused }) => {
                    tracing::info!(
                        clicks = batch.len(),
                        "a batch of {} clicks was committed by an attempt whose answer was lost; \
                         not writing it again",
                        batch.len()
                    );
                    self.shared.health.writes.store(true, Relaxed);
                    // Committed by an earlier attempt: the first began no later.
                    return (Stored::AlreadyCommitted { refused }, first);
                }
                Ok(Stored::AllRefused(error)) => {
                    tracing::warn!(
                        clicks = batch.len(),
                        %error,
                        "every click of a batch of {} refused ({error}): not set aside, as a \
                         table that takes no row needs an operator; retrying",
                        batch.len()
                    );
                    self.shared.counts.db_errors.inc();
                    self.shared.health.writes.store(false, Relaxed);
                }
                Ok(Stored::Retry(why)) => {
                    tracing::warn!(
                        clicks = batch.len(),
                        "a batch of {} clicks waits: {why}; retrying",
                        batch.len()
                    );
                    self.shared.counts.db_errors.inc();
                    self.shared.health.writes.store(false, Relaxed);
                }
                Err(Failure::Db(e)) if !attempts.sift && refuses_rows(&e) => {
                    let error = describe(&e);
                    tracing::warn!(
                        clicks = batch.len(),
                        %error,
                        "writing a batch of {} clicks: {error}; looking for the rows refused",
                        batch.len(),
                    );
                    self.shared.counts.db_errors.inc();
                    attempts.sift = true;
                    continue;
                }
                Err(waiting @ Failure::LockHeld(_)) => match self.watch.cause() {
                    // The session holding the lock is this collector's own, its commit
                    // stuck: not another writer.
                    Some(cause) => {
                        tracing::warn!(error = %waiting, %cause, "{waiting}: {cause}; asking again")
                    }
                    None => tracing::info!(
                        error = %waiting,
                        "{waiting}; asking again on a new connection"
                    ),
                },
                Err(failure) if self.watch.cause().is_some() => {
                    let cause = self.watch.cause().unwrap_or_default();
                    tracing::warn!(
                        clicks = batch.len(),
                        error = %failure,
                        %cause,
                        "writing a batch of {} clicks: {failure}: {cause}; retrying on a new \
                         connection",
                        batch.len()
                    );
                    self.shared.counts.db_errors.inc();
                    self.shared.health.writes.store(false, Relaxed);
                }
                Err(failure) => {
                    tracing::warn!(
                        clicks = batch.len(),
                        error = %failure,
                        "writing a batch of {} clicks: {failure}; retrying on a new connection",
                        batch.len(),
                    );
                    self.shared.counts.db_errors.inc();
                    self.shared.health.writes.store(false, Relaxed);
                }
            }
            self.conn = None;
            // One that found refused clicks got further (the next sets them aside untried):
            // the next waits the shortest.
            if attempts.found_refused() > found {
                backoff.reset();
            }
            backoff.wait().await;
        }
    }

    /// One attempt, on the current connection or a new one, with one deadline for all of it:
    /// connecting, waiting for the instance lock (a connection of an abandoned attempt can hold
    /// it until its last statement ends) and writing.
    async fn attempt(
        &mut self,
        batch: &Batch,
        rows: &Rows,
        number: &BatchNumber,
        attempts: &mut Attempts,
    ) -> Result<Stored, Failure> {
        // Kept outside the attempt, which a timeout drops: it tells a lock held by another
        // session from a database that does not answer.
        let mut wait = Throttle::per_outage();
        let (db, slot) = (&self.db, &mut self.conn);
        let (watch, committed, counts) = (&self.watch, &mut self.committed, &self.shared.counts);
        let gauges = (
            &self.metrics.replication_waiting,
            &self.metrics.instance_lock_waiting,
        );
        let attempt = async {
            let conn = match slot {
                Some(conn) => conn,
                slot => {
                    let client = db.connect().await?;
                    let instance = &number.instance;
                    lock::take(&client, instance, &mut wait, gauges).await?;
                    let conn = Conn::prepare(client).await?;
                    watch.connected(conn.client()).await?;
                    // Perhaps another server now (a failover): does it have what was
                    // committed before?
                    committed.reconnected();
                    committed.check(conn.client(), number, counts).await?;
                    slot.insert(conn)
                }
            };
            conn.write(batch, rows, number, attempts).await
        };
        let result = match timed(self.timeout, attempt).await {
            Err(Failure::Timeout(limit)) if wait.in_run() => Err(Failure::LockHeld(limit)),
            result => result,
        };
        // The wait goes on across attempts (the lock's own gauge ends with each): shown until
        // an attempt ends otherwise, so that a scrape between two finds it too.
        let held = matches!(result, Err(Failure::LockHeld(_)));
        self.metrics.instance_lock_waiting.set(i64::from(held));
        result
    }
}
