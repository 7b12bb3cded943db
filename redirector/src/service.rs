//! Wiring: starts the listeners, the link table task and the drain task, serves until told to
//! stop, then shuts down in order so that every redirect served is a click the collector
//! acknowledged or one counted as dropped.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::admin::AdminView;
use crate::config::{ClickMode, Config};
use crate::direct::Direct;
use crate::drain::{self, Drain, Left};
use crate::http::{self, App, Classifier, Clicks, Limits};
use crate::links::{self, LinkTable};
use crate::metrics::{Common, Dropped};
use crate::ring::Ring;
use crate::state::{self, Closing, Geometry, Kept, Region};
use shared::metrics::{sub_registry, Registry};
use shared::vital::Vitals;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the sockets systemd passed: {0}")]
    Passed(std::io::Error),
    #[error("the state region (--state-file): {0}")]
    State(#[from] state::Error),
    #[error("binding the {what} listener on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Drain(#[from] drain::Error),
    #[error("--database-url: {0}")]
    DatabaseUrl(shared::db::ConfigError),
    #[error("--links-database-url: {0}")]
    LinksDatabaseUrl(shared::db::ConfigError),
    #[error("starting the link loader thread: {0}")]
    Loader(std::io::Error),
    #[error("--clicks direct: connecting to the database: {0}")]
    Direct(String),
    /// Serving on would hand clicks to a ring nobody empties, so the process stops instead.
    #[error("the drain task stopped unexpectedly: {0}")]
    DrainDied(String),
    #[error("the http server task failed: {0}")]
    Server(tokio::task::JoinError),
    /// A part the process needs ended before the stop (`shared::vital`): it stopped as a
    /// signal would have it, and exits with this, for systemd to start it again.
    #[error("{0} ended before the stop")]
    Ended(&'static str),
    #[error("--max-connections: {0}")]
    MaxConnections(String),
    #[error("--dimensions: {0}")]
    Dimensions(&'static str),
    #[error("{0}")]
    Sockets(&'static str),
}

/// The final counts, as logged at exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// GET requests answered with a redirect: each one a click.
    pub redirects: u64,
    /// Clicks an earlier process left in the state region, adopted at start.
    pub recovered: u64,
    pub sent: u64,
    pub dropped: u64,
    /// Of the clicks sent, those the collector acknowledged as committed, and those it had not
    /// by the end of the drain timeout (committed or not: nobody said). Where the state region
    /// outlives the process, what is left is `kept` for the next one; otherwise the
    /// unacknowledged are in `dropped` too (`unacknowledged`). Either way
    /// `redirects + recovered = acked + dropped + kept`, less from `dropped` any `torn` (a
    /// push cut off by a kill was never a redirect, nor a click recovered) and any
    /// `stale_region` counted at start (an earlier process's clicks, never recovered).
    pub acked: u64,
    pub unacked: u64,
    pub kept: u64,
}

/// Resolves on the first SIGTERM or SIGINT, after logging which; installed before it returns.
pub fn signalled() -> std::io::Result<impl Future<Output = ()>> {
    let stop = shared::stop_signal()?;
    Ok(async move { tracing::info!("{}: shutting down", stop.await) })
}

/// Runs the redirector until `shutdown` resolves, then shuts down: stop accepting, let requests
/// in flight finish, drain the ring for up to `--drain-timeout`, count the rest as dropped.
/// A part it needs (the http server, the admin listener, the link loader) that ends before
/// then shuts it down the same way, and is its error (`Error::Ended`; `Error::Server` for an
/// http server task that panicked).
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> Result<Summary, Error> {
    let db: shared::db::Config = cfg.database_url.parse().map_err(Error::DatabaseUrl)?;
    cfg.check_dimensions().map_err(Error::Dimensions)?;
    cfg.check_sockets().map_err(Error::Sockets)?;
    if let Some(shortened) = cfg.shortened() {
        tracing::warn!("{shortened}");
    }
    let mut registry = Registry::with_prefix("redirector");
    let metrics = Metrics::register(&mut registry);
    let started = std::time::UNIX_EPOCH
        .elapsed()
        .map_or(0, |since| since.as_secs());
    (metrics.common.start_time_seconds).set(started.try_into().unwrap_or(i64::MAX));
    let table = Arc::new(LinkTable::default());
    let max_connections =
        http::connection_limit(cfg.max_connections).map_err(Error::MaxConnections)?;
    // Before the admin listener serves: /healthz says ready once the links are loaded, which
    // may come before this function reaches the server task.
    metrics.http.connections_limit.set(max_connections as i64);
    // Under systemd the listeners come from redirector.socket and redirector-admin.socket, so
    // the service itself needs no Internet sockets of its own (RestrictAddressFamilies=AF_UNIX);
    // the state region comes back from the file descriptor store.
    let mut passed = shared::systemd::Passed::take().map_err(Error::Passed)?;
    // Whatever can fail at start, before the state region is adopted: adopting it clears its
    // mark of a clean stop and counts what it holds torn or stale in this process's metrics,
    // which a start that failed after it would have done for nothing.
    let http_listener = listener(&mut passed, "http", cfg.listen).await?;
    let admin_listener = listener(&mut passed, "admin", cfg.admin_listen).await?;
    // The links may come from a replica; clicks (`--clicks direct`) always go to the primary.
    let links_db = match &cfg.links_database_url {
        Some(url) => url.parse().map_err(Error::LinksDatabaseUrl)?,
        None => db.clone(),
    };
    let vitals = Vitals::default();
    let options = links::Options {
        poll: cfg.reload_interval,
        timeout: cfg.link_timeout,
    };
    let loader = metrics.links.clone();
    let loading = vitals.part("the link loader");
    links::spawn(links_db, table.clone(), loader, options, loading).map_err(Error::Loader)?;
    let settings = drain_settings(&cfg);
    // The one step that can fail after the adoption: the send buffer fitted to a region laid
    // out with a larger datagram size than configured (`Drain::new`), known once adopted.
    let (sockets, state) = open_pipeline(&cfg, &settings, passed, &metrics.common)?;
    let ring = state.as_ref().map(|s| s.ring.clone());
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let admin = shared::admin::spawn(
        admin_listener,
        Arc::new(AdminView {
            registry,
            common: metrics.common.clone(),
            ring: ring.clone(),
            links: table.clone(),
            stopping: stopping.clone(),
        }),
    );
    vitals.hold_while("the admin listener", admin);

    let (stop_drain, drain_stopped) = watch::channel(None);
    let kept = state.as_ref().map(|s| s.kept.clone());
    let closing = state.as_ref().map(|s| s.closing.clone());
    let mut drain = match state.zip(sockets) {
        Some((state, sockets)) => Some(tokio::spawn(
            new_drain(settings, state, sockets, &metrics)?
                .run(drain_stopped)
                .instrument(tracing::info_span!("drain")),
        )),
        None => None,
    };
    let (clicks, direct) = clicks(&cfg, db, &ring).await?;
    let app = Arc::new(App {
        links: table.clone(),
        classifier: Classifier::new(cfg.dimensions, cfg.country_header.clone()),
        clicks,
        metrics: metrics.http.clone(),
        common: metrics.common.clone(),
    });
    let limits = Limits {
        header_read_timeout: cfg.header_read_timeout,
        grace: cfg.drain_timeout,
        max_connections,
        idle_timeout: cfg.idle_timeout,
        write_timeout: cfg.write_timeout,
    };
    let (stop_http, server) = start_http(http_listener, app, limits, &vitals);
    let ready = tokio::spawn(async move {
        table.wait_loaded().await;
        shared::systemd::notify_or_log("READY=1");
    });

    let ended = until_stop(shutdown, &vitals, &mut drain).await?;
    shared::systemd::notify_or_log("STOPPING=1");
    stopping.store(true, std::sync::atomic::Ordering::Relaxed);
    ready.abort();
    let _ = stop_http.send(());
    let stopping = Stopping {
        server,
        stop_drain,
        drain,
        direct,
        kept,
        closing,
    };
    let summary = shut_down(stopping, cfg.drain_timeout, &metrics).await?;
    match ended {
        Some(part) => Err(Error::Ended(part)),
        None => Ok(summary),
    }
}

/// Serves redirects in a task of its own (a vital part) until the sender returned is used
/// or dropped.
fn start_http(
    listener: TcpListener,
    app: Arc<App>,
    limits: Limits,
    vitals: &Vitals,
) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let serve = http::serve(listener, app, limits, async {
        let _ = stopped.await;
    });
    let serving = vitals.part("the http server");
    let server = tokio::spawn(async move {
        let _serving = serving;
        serve.await
    });
    (stop, server)
}

/// With `--clicks pipeline`, the drain's sockets, then (last) the state region; with the
/// other modes, neither, and a word on the region systemd kept, if any.
fn open_pipeline(
    cfg: &Config,
    settings: &drain::Settings,
    mut passed: shared::systemd::Passed,
    metrics: &Common,
) -> Result<(Option<drain::Sockets>, Option<Region>), Error> {
    let opened = match cfg.clicks {
        ClickMode::Pipeline => {
            let sockets = drain::Sockets::bind(settings)?;
            sockets.fit(cfg.datagram_size)?;
            let state = open_state(cfg, &mut passed, metrics)?;
            (Some(sockets), Some(state))
        }
        ClickMode::Off | ClickMode::Direct => {
            if let Some(fd) = passed.named(state::FDNAME) {
                unused_state(&fd, "with --clicks off or direct");
            }
            (None, None)
        }
    };
    for (name, _) in passed.rest() {
        tracing::warn!(
            "systemd passed a descriptor named {name:?}; only \"http\", \"admin\" and \"{}\" \
             are used",
            state::FDNAME
        );
    }
    Ok(opened)
}

/// Where a request's click goes: the ring, one INSERT of its own (`--clicks direct`, on
/// connections opened now), or nowhere.
async fn clicks(
    cfg: &Config,
    db: shared::db::Config,
    ring: &Option<Arc<Ring>>,
) -> Result<(Clicks, Option<Arc<Direct>>), Error> {
    if let Some(ring) = ring {
        return Ok((Clicks::Pipeline(ring.clone()), None));
    }
    if cfg.clicks != ClickMode::Direct {
        return Ok((Clicks::Off, None));
    }
    let connections = cfg.direct_connections as usize;
    let direct = Direct::connect(db, connections, cfg.link_timeout)
        .await
        .map_err(|e| Error::Direct(e.to_string()))?;
    let direct = Arc::new(direct);
    Ok((Clicks::Direct(direct.clone()), Some(direct)))
}

/// Each component's metrics, registered into a sub-registry of its own (names unchanged),
/// so that each is handed only what it counts.
#[derive(Default)]
struct Metrics {
    common: Arc<Common>,
    http: Arc<http::Metrics>,
    drain: Arc<drain::Metrics>,
    links: Arc<links::Metrics>,
}

impl Metrics {
    fn register(registry: &mut Registry) -> Metrics {
        Metrics {
            common: Arc::new(Common::register(sub_registry(registry))),
            http: Arc::new(http::Metrics::register(sub_registry(registry))),
            drain: Arc::new(drain::Metrics::register(sub_registry(registry))),
            links: Arc::new(links::Metrics::register(sub_registry(registry))),
        }
    }
}

/// What is left to stop once the server stops accepting.
struct Stopping {
    server: JoinHandle<()>,
    stop_drain: drain::Stop,
    drain: Option<JoinHandle<Left>>,
    /// `--clicks direct`: its INSERTs under way must be counted before the final counts.
    direct: Option<Arc<Direct>>,
    /// Where the state region lives (`--clicks pipeline`): if it survives a stop, what is left
    /// is kept for the next process, not dropped.
    kept: Option<Kept>,
    /// Marks the region clean once the drain is done with it.
    closing: Option<Closing>,
}

/// Waits for the http server task, then drains the ring for up to `drain_timeout`. The rest is
/// kept in the state region for the next process if the region survives a stop (a
/// `--state-file`); otherwise it is counted as dropped: what was never sent as `shutdown`, what was sent and never
/// acknowledged as `unacknowledged`. A failed server task still gets the drain and the final
/// counts (its handlers are gone all the same); its error is returned afterwards.
async fn shut_down(
    stopping: Stopping,
    drain_timeout: Duration,
    metrics: &Metrics,
) -> Result<Summary, Error> {
    let Stopping {
        server,
        stop_drain,
        drain,
        direct,
        kept,
        closing,
    } = stopping;
    let served = server.await;
    if let Some(direct) = direct {
        direct.settled().await;
    }
    // No handler runs any more: what the ring holds now is all there is to send.
    let _ = stop_drain.send(Some(Instant::now() + drain_timeout));
    let left = match drain {
        Some(handle) => handle.await.map_err(|e| Error::DrainDied(e.to_string()))?,
        None => Left::default(),
    };
    let held = left.unsent + left.unacked;
    let kept = match kept {
        Some(kept) if kept.survives_stop() => {
            if held > 0 {
                tracing::info!(kept = %kept, "{held} clicks left in the state region for the next start");
            }
            held
        }
        _ => {
            metrics
                .common
                .clicks_dropped
                .add(Dropped::Shutdown, left.unsent);
            // Sent but never acknowledged: this process held the only copy it could resend,
            // and it is going. Served = acknowledged + dropped, every drop under a named reason.
            metrics
                .common
                .clicks_dropped
                .add(Dropped::Unacknowledged, left.unacked);
            0
        }
    };
    let summary = Summary {
        redirects: metrics.http.redirects.get(),
        recovered: metrics.common.clicks_recovered.get(),
        sent: metrics.common.clicks_sent.get(),
        dropped: metrics.common.clicks_dropped.total(),
        acked: metrics.drain.clicks_acked.get(),
        unacked: left.unacked,
        kept,
    };
    if summary.dropped > 0 {
        tracing::warn!(
            "redirector: dropped by reason: {}",
            drops_by_reason(&metrics.common)
        );
    }
    tracing::info!(
        "redirector: {} clicks sent, {} dropped ({} redirects served, {} clicks recovered at \
         start, {} kept for the next start); {} acknowledged, {} not acknowledged",
        summary.sent,
        summary.dropped,
        summary.redirects,
        summary.recovered,
        summary.kept,
        summary.acked,
        summary.unacked,
    );
    // What was counted as dropped stays in the region all the same: should systemd's store
    // keep it, the next start sends it, and reports it as reclaimed. Marked only once the
    // count is in the log, so that a kill before leaves none reclaimed that no line counted.
    if let Some(Err(e)) = closing.map(|c| c.stopped_cleanly(held - kept)) {
        // The next start after a reboot then counts what the region holds as stale_region.
        tracing::warn!("writing the state region back at the stop: {e}");
    }
    served.map_err(Error::Server)?;
    Ok(summary)
}

/// The clicks dropped in this process's life by reason, those with any: `reason=N, ...`.
fn drops_by_reason(metrics: &Common) -> String {
    use shared::metrics::Label;
    Dropped::ALL
        .iter()
        .map(|&reason| (reason, metrics.clicks_dropped.get(reason)))
        .filter(|&(_, n)| n > 0)
        .map(|(reason, n)| format!("{}={n}", reason.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where the drain sends, and how, as the flags say.
fn drain_settings(cfg: &Config) -> drain::Settings {
    drain::Settings {
        collector: cfg.socket.clone(),
        ack_socket: cfg.ack_socket.clone(),
        ack_socket_mode: cfg.ack_socket_mode,
        flush_every: cfg.flush_interval,
        ack_timeout: cfg.ack_timeout,
    }
}

/// The drain task's state, on its bound `sockets`, going on from the state region.
fn new_drain(
    settings: drain::Settings,
    state: Region,
    sockets: drain::Sockets,
    metrics: &Metrics,
) -> Result<Drain, Error> {
    let sender = state.sender.id();
    let ack_socket = settings.ack_socket.clone();
    let (own, common) = (metrics.drain.clone(), metrics.common.clone());
    let drain = Drain::new(state, sockets, own, common, settings)?;
    tracing::info!(
        sender = format_args!("{sender:016x}"),
        "sending as {sender:016x} from {} (acknowledgements arrive there)",
        ack_socket.display(),
    );
    Ok(drain)
}

/// Says what the state region systemd kept holds, when this start does not use it: its clicks
/// stay there, neither sent nor counted, until a start that uses it sends them.
fn unused_state(fd: &std::os::fd::OwnedFd, why: &str) {
    match state::held_in(fd) {
        Ok(held) => tracing::warn!(
            held,
            "the state region systemd kept holds {held} clicks (at most), not sent {why}: a start that \
             uses it (--clicks pipeline, no --state-file) sends them; `systemctl clean \
             --what=fdstore` lets them go, counted nowhere"
        ),
        Err(e) => tracing::warn!("the state region systemd kept is not used {why}: {e}"),
    }
}

/// The directory of `$RUNTIME_DIRECTORY` (`runtime`: systemd's list of the unit's
/// RuntimeDirectory=, colon-separated) that `path` is in, if any, symbolic links resolved
/// (`/var/run` is `/run`).
fn removed_at_stop(path: &Path, runtime: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    let path = resolved(path)?;
    std::env::split_paths(runtime?)
        .filter(|dir| !dir.as_os_str().is_empty())
        .find(|dir| resolved(dir).is_some_and(|dir| path.starts_with(dir)))
}

/// `path` made absolute, its symbolic links resolved: all of them where it exists, else its
/// directory's (the file need not exist yet).
fn resolved(path: &Path) -> Option<PathBuf> {
    let path = std::path::absolute(path).ok()?;
    if let Ok(real) = std::fs::canonicalize(&path) {
        return Some(real);
    }
    let real = match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir).ok().map(|dir| dir.join(name)),
        _ => None,
    };
    Some(real.unwrap_or(path))
}

/// The state region (the ring and the resend window): `--state-file`, or the one systemd
/// kept, or a new memfd (given to systemd's store when it keeps one for this service).
fn open_state(
    cfg: &Config,
    passed: &mut shared::systemd::Passed,
    metrics: &Common,
) -> Result<Region, Error> {
    let want = Geometry {
        ring: cfg.ring_capacity,
        window: cfg.resend_window,
        slot_size: cfg.datagram_size as u64,
    };
    let stored = passed.named(state::FDNAME);
    let region = match (&cfg.state_file, stored) {
        (Some(path), stored) => {
            if let Some(fd) = stored {
                unused_state(&fd, "while --state-file is set");
            }
            let runtime = std::env::var_os("RUNTIME_DIRECTORY");
            if let Some(dir) = removed_at_stop(path, runtime.as_deref()) {
                tracing::warn!(
                    "--state-file {} is in {}, the service's RuntimeDirectory=, which systemd \
                     removes at every stop and restart unless the unit sets \
                     RuntimeDirectoryPreserve=yes: what a stop leaves in the file for the next \
                     start would be lost, and counted nowhere. Under the shipped unit, leave \
                     --state-file unset: systemd's file descriptor store keeps the state",
                    path.display(),
                    dir.display()
                );
            }
            Region::file(path, want)
        }
        (None, Some(fd)) => Region::stored(fd, want),
        (None, None) => Region::memfd(want, shared::systemd::fd_store_enabled()),
    }?;
    let mut region = region;
    if let Some(fd) = region.upload.take() {
        if let Err(e) = shared::systemd::store_fd(state::FDNAME, &fd) {
            tracing::warn!("handing the state region to systemd's file descriptor store: {e}");
            region.kept = Kept::No;
        }
    }
    log_state(&region, want);
    if matches!(region.kept, Kept::File(_)) && !state::boot_known() {
        tracing::warn!(
            "this boot's id (/proc/sys/kernel/random/boot_id) cannot be read (a unit's \
             ProcSubset=pid hides it): after a host crash, the --state-file will be trusted as \
             it is found, though its pages may be of different ages; keep it on a tmpfs, or let \
             the redirector read /proc/sys"
        );
    }
    metrics.clicks_recovered.inc_by(region.recovered);
    if region.reclaimed > 0 {
        tracing::info!(
            "{} of the clicks recovered were counted as dropped by the last stop (it could not \
             tell that systemd would keep them): sent after all, counted as reclaimed",
            region.reclaimed
        );
    }
    metrics.clicks_reclaimed.inc_by(region.reclaimed);
    region.closing.reclaimed_reported();
    metrics.clicks_dropped.add(Dropped::Torn, region.torn);
    metrics
        .clicks_dropped
        .add(Dropped::StaleRegion, region.stale);
    Ok(region)
}

fn log_state(region: &Region, want: Geometry) {
    let g = region.geometry;
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    tracing::info!(
        kept = %region.kept,
        "state region: ring of {} clicks x {} B = {:.1} MiB, resend window of {} datagrams of up \
         to {} B = {:.1} MiB",
        g.ring,
        Ring::CELL_SIZE,
        mib(g.ring * Ring::CELL_SIZE as u64),
        g.window,
        g.slot_size,
        mib(g.window * g.slot_size),
    );
    if g != want {
        tracing::warn!(
            "the state region was laid out for --ring-capacity {} --resend-window {} \
             --datagram-size {} and still holds clicks: it is used as it is, and laid out as \
             configured at a start that finds it empty",
            g.ring,
            g.window,
            g.slot_size
        );
    }
    if region.recovered > 0 || region.torn > 0 {
        tracing::warn!(
            recovered = region.recovered,
            torn = region.torn,
            "adopted the clicks an earlier process left: sending them again from seq {}",
            region.window.next_seq() - region.window.len() as u64
        );
    }
}

/// The listener systemd passed under the name `what`, or else one bound at `addr`. Its address
/// is logged either way (scripts and tests read it there).
async fn listener(
    passed: &mut shared::systemd::Passed,
    what: &'static str,
    addr: SocketAddr,
) -> Result<TcpListener, Error> {
    let (listener, from) = match passed.named(what) {
        Some(fd) => {
            let std = shared::systemd::Passed::tcp_listener(fd, what).map_err(Error::Passed)?;
            (
                TcpListener::from_std(std).map_err(Error::Passed)?,
                " (from systemd)",
            )
        }
        None => {
            let bound = TcpListener::bind(addr).await;
            (
                bound.map_err(|source| Error::Bind { what, addr, source })?,
                "",
            )
        }
    };
    let local = listener
        .local_addr()
        .map_err(|source| Error::Bind { what, addr, source })?;
    tracing::info!("{what} listening on {local}{from}");
    Ok(listener)
}

/// Waits for `shutdown`, or for a vital part to end (which it names), whichever comes first;
/// a drain that dies first is the error: serving on would hand clicks to a ring nobody
/// empties, and nothing is left to drain it at the stop.
async fn until_stop(
    shutdown: impl Future<Output = ()>,
    vitals: &Vitals,
    drain: &mut Option<JoinHandle<Left>>,
) -> Result<Option<&'static str>, Error> {
    tokio::select! {
        stopped = vitals.until(shutdown) => Ok(stopped.err()),
        why = died(drain) => Err(Error::DrainDied(why)),
    }
}

/// Resolves only if the drain task ends before it was told to stop; never without one.
async fn died(drain: &mut Option<JoinHandle<Left>>) -> String {
    match drain {
        Some(handle) => match handle.await {
            Ok(_) => "it returned before shutdown".into(),
            Err(e) => e.to_string(),
        },
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::dimensions::Dimensions;

    #[test]
    fn a_state_file_in_a_runtime_directory_is_one_systemd_removes_at_stop() {
        let runtime = std::ffi::OsString::from("/run/clicks-redirector:/run/other");
        let at = |path: &str| removed_at_stop(Path::new(path), Some(&runtime));
        assert_eq!(at("/run/other/state"), Some(PathBuf::from("/run/other")));
        assert_eq!(
            at("/run/clicks-redirector/sub/state"),
            Some(PathBuf::from("/run/clicks-redirector"))
        );
        assert_eq!(
            at("/run/clicks-redirector-state"),
            None,
            "by component, not by prefix"
        );
        assert_eq!(at("/var/lib/clicks/state"), None);
        assert_eq!(removed_at_stop(Path::new("/run/other/state"), None), None);
        let empty = std::ffi::OsString::new();
        assert_eq!(removed_at_stop(Path::new("/state"), Some(&empty)), None);
    }

    #[test]
    fn a_state_file_reached_through_a_symbolic_link_is_found_in_the_runtime_directory() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let real = tmp.path().join("run");
        std::fs::create_dir_all(real.join("clicks-redirector")).expect("mkdir");
        let link = tmp.path().join("var-run");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        let through_link = link.join("clicks-redirector");
        let through_real = real.join("clicks-redirector");
        assert_eq!(
            removed_at_stop(&through_link.join("state"), Some(through_real.as_os_str())),
            Some(through_real.clone()),
            "the file named through the link"
        );
        assert_eq!(
            removed_at_stop(&through_real.join("state"), Some(through_link.as_os_str())),
            Some(through_link),
            "the runtime directory named through the link"
        );
        let elsewhere = tmp.path().join("state-link");
        std::fs::write(through_real.join("state"), b"").expect("a state file");
        std::os::unix::fs::symlink(through_real.join("state"), &elsewhere).expect("symlink");
        assert_eq!(
            removed_at_stop(&elsewhere, Some(through_real.as_os_str())),
            Some(through_real.clone()),
            "the file itself a link into the runtime directory"
        );
    }

    /// A part that ends stops the process as the signal would (`shared::vital`'s tests); a
    /// drain that dies is the error.
    #[tokio::test]
    async fn a_vital_part_or_the_drain_that_ends_ends_the_wait_for_the_stop() {
        let vitals = Vitals::default();
        let _loading = vitals.part("the link loader");
        drop(vitals.part("the http server"));
        let signal = tokio::time::sleep(testkit::LIMIT);
        let ended = until_stop(signal, &vitals, &mut None).await;
        assert!(matches!(ended, Ok(Some("the http server"))), "{ended:?}");

        let vitals = Vitals::default();
        let _serving = vitals.part("the http server");
        let ended = until_stop(async {}, &vitals, &mut None).await;
        assert!(matches!(ended, Ok(None)), "{ended:?}");

        let vitals = Vitals::default();
        let _serving = vitals.part("the http server");
        let drain = tokio::spawn(async { panic!("a defect in the drain") });
        let signal = tokio::time::sleep(testkit::LIMIT);
        let ended = until_stop(signal, &vitals, &mut Some(drain)).await;
        assert!(matches!(ended, Err(Error::DrainDied(_))), "{ended:?}");
    }

    #[tokio::test]
    async fn a_failed_server_task_still_gets_the_drain_and_the_counts_then_its_error() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::default();
        let state = Region::in_process(100, 16).unwrap();
        for at in 0..10 {
            state.ring.push("left", at, &Dimensions::default()).unwrap();
        }
        // Nobody listens at the path, so the drain can only count the clicks as left.
        let settings = drain::Settings {
            collector: dir.path().join("nobody.sock"),
            ack_socket: dir.path().join("ack.sock"),
            ack_socket_mode: 0o600,
            flush_every: Duration::from_secs(3600),
            ack_timeout: Duration::from_secs(2),
        };
        let (own, common) = (metrics.drain.clone(), metrics.common.clone());
        let sockets = drain::Sockets::bind(&settings).unwrap();
        let drain = Drain::new(state, sockets, own, common, settings).unwrap();
        let (stop_drain, stopped) = watch::channel(None);
        let drain = tokio::spawn(drain.run(stopped));
        let server = tokio::spawn(async { panic!("the http server task fails") });

        let stopping = Stopping {
            server,
            stop_drain,
            drain: Some(drain),
            direct: None,
            kept: Some(Kept::No),
            closing: None,
        };
        let result = shut_down(stopping, Duration::from_millis(50), &metrics).await;
        assert!(matches!(result, Err(Error::Server(_))), "{result:?}");
        assert_eq!(metrics.common.clicks_dropped.get(Dropped::Shutdown), 10);
    }
}
