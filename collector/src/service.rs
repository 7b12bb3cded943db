//! The collector process: start-up order, the tasks, signals and the lossless stop.

use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tracing::Instrument;

use shared::metrics::{sub_registry, Registry};
use shared::throttle::Throttle;
use shared::vital::Vitals;
use tokio::net::TcpListener;
use tokio::task::{AbortHandle, JoinHandle};

use crate::config::Config;
use crate::db::{self, describe, Db};
use crate::ingest::mirror::Mirror;
use crate::ingest::receive::{Receiver, Settings};
use crate::ingest::senders::{self, Senders};
use crate::ingest::socket::Inbox;
use crate::metrics::{AdminView, Shared};
use crate::upkeep::{compact, link_triggers, maintenance, partitions};
use crate::write::batch::{self, DateWindow, Handoff};
use crate::write::replication::{Committed, Watch};
use crate::write::store::{self, Conn};
use crate::write::unfolded::{Meters, Unfolded};
use crate::write::writer::Writer;
use crate::write::{copy, lock};
use crate::{ingest, upkeep, write};
use schema as migrations;

/// Why the collector could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum Fatal {
    #[error("--database-url: {0}")]
    Url(shared::db::ConfigError),
    #[error("database: {}", describe(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("admin listener on {addr}: {source}")]
    Admin {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("socket: {0}")]
    Socket(#[from] crate::ingest::socket::OpenError),
    #[error("--mirror: {0}")]
    Mirror(std::io::Error),
    #[error("installing signal handlers: {0}")]
    Signals(std::io::Error),
    #[error(transparent)]
    WriterGone(#[from] crate::ingest::receive::WriterGone),
    #[error("{0}")]
    AllowUid(crate::ingest::userns::Unmapped),
    /// A part the process needs ended before the stop (`shared::vital`): it stopped as a
    /// signal would have it, and exits with this, for systemd to start it again.
    #[error("{0} ended before the stop")]
    Ended(&'static str),
}

/// `collector migrate`: applies what is missing and returns.
pub async fn migrate(database_url: &str) -> Result<(), Fatal> {
    let db = Db::parse(database_url).map_err(Fatal::Url)?;
    let mut client = db.connect().await?;
    let applied = migrations::apply(&mut client).await?;
    tracing::info!(
        version = migrations::LATEST,
        applied = applied.len(),
        "schema at version {} ({} applied now)",
        migrations::LATEST,
        applied.len()
    );
    Ok(())
}

/// Each component's metrics, registered into a sub-registry of its own.
struct Metrics {
    ingest: Arc<ingest::Metrics>,
    write: Arc<write::Metrics>,
    upkeep: Arc<upkeep::Metrics>,
}

impl Metrics {
    fn register(registry: &mut Registry) -> Metrics {
        Metrics {
            ingest: Arc::new(ingest::Metrics::register(sub_registry(registry))),
            write: Arc::new(write::Metrics::register(sub_registry(registry))),
            upkeep: Arc::new(upkeep::Metrics::register(sub_registry(registry))),
        }
    }
}

/// What start-up reads from the database before the first datagram is taken, and the
/// writer's connection, which holds the instance lock.
struct Start {
    senders: Senders,
    /// What the instance's processes before this one committed, for the writer's checks
    /// after a failover.
    committed: Committed,
    backlog: compact::Backlog,
    conn: Conn,
}

/// Runs the collector until SIGTERM or SIGINT, then drains, commits and returns. A part it
/// needs (the admin listener, the fold, the partitions round, the replication watch) that
/// ends before then stops it the same way, and is its error (`Fatal::Ended`); the writer's
/// end is the receiver's (`WriterGone`).
pub async fn run(database_url: &str, config: Config) -> Result<(), Fatal> {
    check_allowed_uids(&config)?;
    let db = Db::parse(database_url)
        .map_err(Fatal::Url)?
        .for_instance(&config.instance, config.write_timeout);
    let mut registry = Registry::with_prefix("collector");
    let shared = Arc::new(Shared::register(&mut registry));
    let metrics = Metrics::register(&mut registry);
    let vitals = Vitals::default();
    let admin = AdminView::new(registry, shared.clone());
    let Opened {
        passed,
        mirror,
        mut stop,
    } = open(&config, admin, &vitals).await?;
    let upkeep = maintenance_policy(&config);
    let watch = start_watch(&db, &config, &metrics, &vitals);
    let start = tokio::select! {
        start = prepare(&db, &config.instance, &upkeep, (&metrics, &watch), &shared) => start,
        stopped = vitals.until(&mut stop) => {
            shared::systemd::notify_or_log("STOPPING=1");
            let name = stopped.map_err(Fatal::Ended)?;
            tracing::info!(signal = name, "{name} before the database was reached; nothing received");
            return Ok(());
        }
    };
    // Opened only now: until the database is reached, senders find no socket and keep their
    // clicks, rather than queue datagrams that a stop in the meantime would discard.
    let inbox = Inbox::open(&config.socket, config.socket_mode, passed)?;
    announce(&config, &start, &metrics, &shared);
    let unfolded = new_unfolded(&config, &metrics);
    let (handoff, writer) = start_writer(
        &db,
        (start.conn, start.committed, watch),
        &config,
        &unfolded,
        &metrics,
        &shared,
    );
    let settings = receive_settings(&config);
    let receiver = Receiver::new(
        inbox,
        start.senders,
        mirror,
        metrics.ingest.clone(),
        shared.clone(),
        settings,
        handoff,
    );
    let upkeep_tasks = start_upkeep(db, upkeep, unfolded, (&metrics, &shared), &vitals);
    // A task, not the main thread's: the worker that sees the socket's readiness runs it,
    // rather than waking the main thread whenever a datagram comes while it waits.
    let receive = receiver
        .run(stopping(vitals.clone(), stop))
        .instrument(tracing::info_span!("receive"));
    let received = match tokio::spawn(receive).await {
        Ok(received) => received,
        // As if it had run here: nothing cancels it while this waits.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    wind_down(writer, upkeep_tasks, &metrics).await;
    received.map_err(Fatal::from)?;
    vitals
        .ended()
        .map_or(Ok(()), |part| Err(Fatal::Ended(part)))
}

/// What start-up holds before the database is reached.
struct Opened {
    /// The sockets systemd passed but the admin listener's: held, not read, until the
    /// database is reached (see `Inbox::open`).
    passed: Vec<OwnedFd>,
    mirror: Option<Mirror>,
    stop: Pin<Box<dyn Future<Output = &'static str> + Send>>,
}

/// Serves the admin listener (as a vital part), takes the sockets systemd passed, opens the
/// `--mirror` and installs the signal handlers; then tells systemd the service is ready.
async fn open(config: &Config, admin: AdminView, vitals: &Vitals) -> Result<Opened, Fatal> {
    // Under systemd: the datagram socket (collector.socket) and the admin listener
    // (collector-admin.socket, named "admin"), so the service needs no Internet sockets of its
    // own.
    let mut passed =
        shared::systemd::Passed::take().map_err(crate::ingest::socket::OpenError::Io)?;
    let admin = listen_admin(passed.named("admin"), config.admin_listen, Arc::new(admin))
        .await
        .map_err(|source| Fatal::Admin {
            addr: config.admin_listen,
            source,
        })?;
    vitals.hold_while("the admin listener", admin);
    let passed: Vec<OwnedFd> = passed.rest().into_iter().map(|(_, fd)| fd).collect();
    crate::ingest::socket::check_passed(&passed)?;
    let mirror = open_mirror(config, &passed)?;
    let stop = Box::pin(shared::stop_signal().map_err(Fatal::Signals)?);
    // Ready for systemd once the sockets are in hand, before the database: redirector.service
    // is ordered after this unit (for the stop: it drains into a running collector), and a
    // start job of this one still under way held every start of the redirector behind it
    // (another host's collector holding this instance's lock, a migration, a commit waiting
    // for a standby), though the redirector needs nothing of the collector to serve. The
    // socket queues meanwhile; /healthz says when it writes.
    shared::systemd::notify_or_log("READY=1");
    Ok(Opened {
        passed,
        mirror,
        stop,
    })
}

/// Looks at the sessions of start-up and then of the writer from one of its own while a
/// commit takes long, for as long as the process runs (a vital part): a commit that waits
/// for a standby is named as such.
fn start_watch(db: &Db, config: &Config, metrics: &Metrics, vitals: &Vitals) -> Arc<Watch> {
    let watch = Watch::new(metrics.write.clone());
    let watching = tokio::spawn(
        watch
            .clone()
            .run(db.clone(), config.write_timeout)
            .instrument(tracing::info_span!("replication")),
    );
    vitals.hold_while("the replication watch", watching);
    watch
}

/// Says, in the metrics, /healthz and the log, that the collector writes.
fn announce(config: &Config, start: &Start, metrics: &Metrics, shared: &Shared) {
    maintenance::show(&metrics.upkeep, &start.backlog);
    shared.health.writes.store(true, Relaxed);
    shared.health.upkeep.store(true, Relaxed);
    shared.health.started.store(true, Relaxed);
    tracing::info!(
        instance = %config.instance,
        senders = start.senders.len(),
        "ready: instance {:?}, {} known senders",
        config.instance,
        start.senders.len()
    );
}

/// The clicks' counts written but not yet folded, bounded by `--compact-memory`, under this
/// writer's id.
fn new_unfolded(config: &Config, metrics: &Metrics) -> Arc<Unfolded> {
    let meters = Meters {
        bytes: metrics.upkeep.unfolded_bytes.clone(),
        dropped: metrics.upkeep.unfolded_dropped.clone(),
    };
    // Below 2^63: a positive bigint.
    let writer_id = protocol::wire::random_sender() as i64;
    Arc::new(Unfolded::bounded(writer_id, config.compact_memory, meters))
}

/// What the receive loop takes from the flags.
fn receive_settings(config: &Config) -> Settings {
    Settings {
        batch_rows: config.batch_rows as usize,
        flush_interval: config.flush_interval,
        window: DateWindow {
            max_age_us: micros(config.max_click_age),
            max_skew_us: micros(config.max_click_skew),
        },
        allowed_uids: config.allow_uid.clone(),
    }
}

/// Starts the partitions round and the fold, each a vital part with a span of its own (so
/// that its lines can be told apart, and filtered: `RUST_LOG`); returns what aborts them at
/// the stop.
fn start_upkeep(
    db: Db,
    upkeep: maintenance::Policy,
    unfolded: Arc<Unfolded>,
    (metrics, shared): (&Metrics, &Arc<Shared>),
    vitals: &Vitals,
) -> [AbortHandle; 2] {
    let partitions = tokio::spawn(
        maintenance::run_partitions(db.clone(), upkeep, metrics.upkeep.clone(), shared.clone())
            .instrument(tracing::info_span!("partitions")),
    );
    let fold = tokio::spawn(
        maintenance::run(db, upkeep, unfolded, metrics.upkeep.clone(), shared.clone())
            .instrument(tracing::info_span!("fold")),
    );
    let aborts = [partitions.abort_handle(), fold.abort_handle()];
    vitals.hold_while("the partitions round", partitions);
    vitals.hold_while("the fold", fold);
    aborts
}

/// Once the receive loop has ended (and with it the writer's channel ends): waits for the
/// writer to commit the last batch, then stops the upkeep.
async fn wind_down(writer: JoinHandle<()>, upkeep: [AbortHandle; 2], metrics: &Metrics) {
    if let Err(e) = writer.await {
        tracing::error!(error = %e, "the database writer failed: {e}");
    }
    upkeep.iter().for_each(AbortHandle::abort);
    let written = metrics.write.clicks_written.get();
    tracing::info!(written, "collector: {written} clicks written");
}

/// What the receive loop waits on for its stop: the signal, or a vital part's end.
async fn stopping(vitals: Vitals, stop: impl Future<Output = &'static str> + Unpin) {
    if let Ok(signal) = vitals.until(stop).await {
        tracing::info!(
            signal,
            "{signal}: draining the socket, writing what is pending"
        );
    }
    shared::systemd::notify_or_log("STOPPING=1");
}

/// `--allow-uid` against the user namespace the collector runs in: a uid it does not map
/// (PrivateUsers=yes maps only root and the service's user) can never be seen, and every
/// datagram would be refused, so the collector does not start. Checked before anything else.
fn check_allowed_uids(config: &Config) -> Result<(), Fatal> {
    let Some(allowed) = &config.allow_uid else {
        return Ok(());
    };
    match crate::ingest::userns::UidMap::read() {
        Ok(Some(map)) => crate::ingest::userns::check(allowed, &map).map_err(Fatal::AllowUid),
        Ok(None) => Ok(()),
        Err(e) => {
            tracing::warn!(
                error = %e,
                "reading /proc/self/uid_map: {e}; --allow-uid not checked against the user \
                 namespace"
            );
            Ok(())
        }
    }
}

/// What the maintenance task does, from the flags.
fn maintenance_policy(config: &Config) -> maintenance::Policy {
    maintenance::Policy {
        fold: compact::Policy {
            interval: config.compact_interval,
            backlog: i64::from(config.compact_backlog),
            slice: compact::SLICE_ENTRIES,
        },
        window_back_days: whole_days(config.max_click_age),
        window_ahead_days: whole_days(config.max_click_skew),
        retention_days: config.retention.map(i32::from),
        timeout: config.write_timeout,
    }
}

/// A window's flag in whole days, rounded up from its last nanosecond: `1d 500ms` reaches into
/// a second day, whose partition must be kept. At most 365 (the flags' own bound).
fn whole_days(d: std::time::Duration) -> i32 {
    const DAY_NS: u128 = 24 * 3600 * 1_000_000_000;
    i32::try_from(d.as_nanos().div_ceil(DAY_NS)).unwrap_or(i32::MAX)
}

/// A flag's duration in microseconds (flags are at most 365 days).
fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Takes the admin listener systemd passed, or binds one at `addr`; logs its address (tests
/// and scripts read it there) and serves, in the task returned.
async fn listen_admin(
    passed: Option<std::os::fd::OwnedFd>,
    addr: SocketAddr,
    admin: Arc<AdminView>,
) -> std::io::Result<JoinHandle<()>> {
    let (listener, from) = match passed {
        Some(fd) => {
            let std = shared::systemd::Passed::tcp_listener(fd, "admin")?;
            (TcpListener::from_std(std)?, " (from systemd)")
        }
        None => (TcpListener::bind(addr).await?, ""),
    };
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "admin listening on {addr}{from}");
    Ok(shared::admin::spawn(listener, admin))
}

/// Starts the writer task; returns the receiver's ends of its channels and the task, which
/// ends once the receiver is gone and the last batch is committed.
fn start_writer(
    db: &Db,
    (conn, committed, watch): (Conn, Committed, Arc<Watch>),
    config: &Config,
    unfolded: &Arc<Unfolded>,
    metrics: &Metrics,
    shared: &Arc<Shared>,
) -> (Handoff, JoinHandle<()>) {
    let (handoff, writer_ends) = batch::handoff();
    let writer = Writer::new(
        db.clone(),
        &config.instance,
        config.write_timeout,
        unfolded.clone(),
        metrics.write.clone(),
        shared.clone(),
        Some(conn),
    )
    .after(committed)
    .watched_by(watch);
    let span = tracing::info_span!("writer");
    (
        handoff,
        tokio::spawn(writer.run(writer_ends).instrument(span)),
    )
}

/// Connects (retrying with backoff while the database is away), waits for the lock of
/// `instance`, migrates, creates the partitions (so the first batch finds its day; the rest of
/// the partitions' upkeep, which can take minutes, is `maintenance::run_partitions`'), and loads
/// the senders' seqs: the lock comes first, so that they are read only once no predecessor of
/// this instance can still commit.
async fn prepare(
    db: &Db,
    instance: &str,
    upkeep: &maintenance::Policy,
    (metrics, watch): (&Metrics, &Watch),
    shared: &Shared,
) -> Start {
    let mut backoff = db::backoff();
    loop {
        match try_prepare(db, instance, upkeep, (metrics, watch)).await {
            Ok(start) => return start,
            Err(error) => {
                shared.counts.db_errors.inc();
                tracing::warn!(%error, "database not ready: {error}; retrying");
                backoff.wait().await;
            }
        }
    }
}

async fn try_prepare(
    db: &Db,
    instance: &str,
    upkeep: &maintenance::Policy,
    (metrics, watch): (&Metrics, &Watch),
) -> Result<Start, db::Failure> {
    // Connecting has a deadline (--write-timeout; tokio-postgres' connect_timeout bounds the
    // socket's connect, not the startup): a server that accepts and never answers is tried
    // again. The steps after it have none, as a migration may take long.
    let mut client = db::timed(upkeep.timeout, db.connect()).await?;
    let gauges = (
        &metrics.write.replication_waiting,
        &metrics.write.instance_lock_waiting,
    );
    lock::take(&client, instance, &mut Throttle::per_outage(), gauges).await?;
    // The steps below commit with no deadline: one waiting for a standby (a promoted one that
    // kept synchronous_standby_names) would hold the start up unnamed, the socket unbound.
    store::durable_commits(&client).await?;
    watch.connected(&client).await?;
    watch.writing();
    migrations::apply(&mut client).await?;
    link_triggers::set_back(
        &mut client,
        link_triggers::Report::All,
        link_triggers::LOCK_WAIT,
        &metrics.upkeep,
    )
    .await;
    let today = copy::pg_day(protocol::now_us());
    let created = partitions::create_at_start(&client, &upkeep.partitions(today)).await?;
    metrics.upkeep.partitions_created.inc_by(created);
    watch.written();
    Ok(Start {
        senders: senders::load(&client, instance).await?,
        committed: Committed::of_instance(&client, instance).await?,
        backlog: compact::backlog(&client).await?,
        conn: Conn::prepare(client).await?,
    })
}

/// The `--mirror` socket, if any, refused where it is the collector's own (`--socket`, or
/// the one systemd passed): each datagram forwarded would come back to be forwarded again,
/// for ever. Checked before the database steps, which a configuration error would otherwise
/// wait through, only to fail at each restart after them.
fn open_mirror(config: &Config, passed: &[OwnedFd]) -> Result<Option<Mirror>, Fatal> {
    let Some(mirror) = &config.mirror else {
        return Ok(None);
    };
    let inbox = match passed {
        [] => Some(config.socket.clone()),
        [fd, ..] => crate::ingest::socket::bound_path(fd.as_fd()),
    };
    if inbox.is_some_and(|inbox| shared::socket::same_path(mirror, &inbox)) {
        let own = "is the collector's own socket (--socket, or the one systemd passed): a tap \
                   needs a socket of its own";
        return Err(Fatal::Mirror(std::io::Error::other(own)));
    }
    Mirror::new(mirror.clone()).map(Some).map_err(Fatal::Mirror)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_window_in_whole_days_counts_any_part_of_a_day() {
        const DAY: Duration = Duration::from_secs(24 * 3600);
        assert_eq!(whole_days(DAY), 1);
        assert_eq!(whole_days(DAY + Duration::from_millis(500)), 2);
        assert_eq!(whole_days(Duration::from_millis(1)), 1);
        assert_eq!(whole_days(DAY * 365), 365);
    }
}
