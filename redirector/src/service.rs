//! Wiring: starts the listeners, the link table task and the drain task, serves until told to
//! stop, then shuts down in order so that every redirect served is a click the collector
//! acknowledged or one counted as dropped.

use std::future::Future;
use std::net::SocketAddr;
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
use crate::http::{self, App, Clicks, Limits};
use crate::links::{self, LinkTable};
use crate::metrics::{Dropped, Metrics};
use crate::ring::Ring;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the sockets systemd passed: {0}")]
    Passed(std::io::Error),
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
    #[error("starting the link loader thread: {0}")]
    Loader(std::io::Error),
    #[error("--clicks direct: connecting to the database: {}", shared::db::describe(.0))]
    Direct(tokio_postgres::Error),
    /// Serving on would hand clicks to a ring nobody empties, so the process stops instead.
    #[error("the drain task stopped unexpectedly: {0}")]
    DrainDied(String),
    #[error("the http server task failed: {0}")]
    Server(tokio::task::JoinError),
    #[error("--max-connections: {0}")]
    MaxConnections(String),
}

/// The final counts, as logged at exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// GET requests answered with a redirect: each one a click.
    pub redirects: u64,
    pub sent: u64,
    pub dropped: u64,
    /// Of the clicks sent, those the collector acknowledged as committed, and those it had not
    /// by the end of the drain timeout (committed or not: nobody said). The unacknowledged are
    /// in `dropped` too (`unacknowledged`), so `redirects = acked + dropped`.
    pub acked: u64,
    pub unacked: u64,
}

/// Resolves on the first SIGTERM or SIGINT, after logging which; installed before it returns.
pub fn signalled() -> std::io::Result<impl Future<Output = ()>> {
    let stop = shared::stop_signal()?;
    Ok(async move { tracing::info!("{}: shutting down", stop.await) })
}

/// Runs the redirector until `shutdown` resolves, then shuts down: stop accepting, let requests
/// in flight finish, drain the ring for up to `--drain-timeout`, count the rest as dropped.
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> Result<Summary, Error> {
    let db: shared::db::Config = cfg.database_url.parse().map_err(Error::DatabaseUrl)?;
    let metrics = Arc::new(Metrics::default());
    let table = Arc::new(LinkTable::default());
    let max_connections =
        http::connection_limit(cfg.max_connections).map_err(Error::MaxConnections)?;
    let ring = (cfg.clicks == ClickMode::Pipeline).then(|| new_ring(&cfg));

    // Under systemd the listeners come from redirector.socket and redirector-admin.socket, so
    // the service itself needs no Internet sockets of its own (RestrictAddressFamilies=AF_UNIX).
    let mut passed = shared::systemd::Passed::take().map_err(Error::Passed)?;
    let http_listener = listener(&mut passed, "http", cfg.listen).await?;
    let admin_listener = listener(&mut passed, "admin", cfg.admin_listen).await?;
    for (name, _) in passed.rest() {
        tracing::warn!(
            "systemd passed a socket named {name:?}; only \"http\" and \"admin\" are used"
        );
    }
    shared::admin::spawn(
        admin_listener,
        Arc::new(AdminView {
            metrics: metrics.clone(),
            ring: ring.clone(),
            links: table.clone(),
        }),
    );
    let options = links::Options {
        poll: cfg.reload_interval,
        timeout: cfg.link_timeout,
    };
    links::spawn(db.clone(), table.clone(), metrics.clone(), options).map_err(Error::Loader)?;

    let (stop_drain, drain_stopped) = watch::channel(None);
    let mut drain = match &ring {
        Some(ring) => Some(tokio::spawn(
            new_drain(&cfg, ring.clone(), metrics.clone())?
                .run(drain_stopped)
                .instrument(tracing::info_span!("drain")),
        )),
        None => None,
    };
    let direct = match (&ring, cfg.clicks) {
        (None, ClickMode::Direct) => Some(Arc::new(
            Direct::connect(&db, cfg.direct_connections as usize)
                .await
                .map_err(Error::Direct)?,
        )),
        _ => None,
    };
    let clicks = match (&ring, &direct) {
        (Some(ring), _) => Clicks::Pipeline(ring.clone()),
        (None, Some(direct)) => Clicks::Direct(direct.clone()),
        (None, None) => Clicks::Off,
    };
    let app = Arc::new(App {
        links: table.clone(),
        clicks,
        metrics: metrics.clone(),
    });
    let limits = Limits {
        header_read_timeout: cfg.header_read_timeout,
        grace: cfg.drain_timeout,
        max_connections,
        idle_timeout: cfg.idle_timeout,
        write_timeout: cfg.write_timeout,
    };
    let (stop_http, http_stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(http::serve(http_listener, app, limits, async {
        let _ = http_stopped.await;
    }));
    let ready = tokio::spawn(async move {
        table.wait_loaded().await;
        shared::systemd::notify_or_log("READY=1");
    });

    tokio::select! {
        _ = shutdown => {}
        why = died(&mut drain) => return Err(Error::DrainDied(why)),
    }
    shared::systemd::notify_or_log("STOPPING=1");
    ready.abort();
    let _ = stop_http.send(());
    let stopping = Stopping {
        server,
        stop_drain,
        drain,
        direct,
    };
    shut_down(stopping, cfg.drain_timeout, &metrics).await
}

/// What is left to stop once the server stops accepting.
struct Stopping {
    server: JoinHandle<()>,
    stop_drain: drain::Stop,
    drain: Option<JoinHandle<Left>>,
    /// `--clicks direct`: its INSERTs under way must be counted before the final counts.
    direct: Option<Arc<Direct>>,
}

/// Waits for the http server task, then drains the ring for up to `drain_timeout` and counts
/// the rest as dropped: what was never sent as `shutdown`, what was sent and never
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
    metrics.clicks_dropped.add(Dropped::Shutdown, left.unsent);
    // Sent but never acknowledged: this process held the only copy it could resend, and it is
    // going. Served = acknowledged + dropped, every drop under a named reason.
    metrics
        .clicks_dropped
        .add(Dropped::Unacknowledged, left.unacked);
    let summary = Summary {
        redirects: metrics.redirects.get(),
        sent: metrics.clicks_sent.get(),
        dropped: metrics.clicks_dropped.total(),
        acked: metrics.clicks_acked.get(),
        unacked: left.unacked,
    };
    if summary.dropped > 0 {
        tracing::warn!(
            "redirector: dropped by reason: {}",
            drops_by_reason(metrics)
        );
    }
    tracing::info!(
        "redirector: {} clicks sent, {} dropped ({} redirects served); {} acknowledged, {} not \
         acknowledged",
        summary.sent,
        summary.dropped,
        summary.redirects,
        summary.acked,
        summary.unacked
    );
    served.map_err(Error::Server)?;
    Ok(summary)
}

/// The clicks dropped in this process's life by reason, those with any: `reason=N, ...`.
fn drops_by_reason(metrics: &Metrics) -> String {
    use shared::metrics::Label;
    Dropped::ALL
        .iter()
        .map(|&reason| (reason, metrics.clicks_dropped.get(reason)))
        .filter(|&(_, n)| n > 0)
        .map(|(reason, n)| format!("{}={n}", reason.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The drain task's state, its ack socket bound and its resend window allocated.
fn new_drain(cfg: &Config, ring: Arc<Ring>, metrics: Arc<Metrics>) -> Result<Drain, Error> {
    let settings = drain::Settings {
        collector: cfg.socket.clone(),
        ack_socket: cfg.ack_socket.clone(),
        ack_socket_mode: cfg.ack_socket_mode,
        datagram_limit: cfg.datagram_size,
        window: cfg.resend_window as usize,
        flush_every: cfg.flush_interval,
        ack_timeout: cfg.ack_timeout,
    };
    let sender = protocol::wire::random_sender();
    let drain = Drain::new(ring, metrics, settings, sender)?;
    tracing::info!(
        "sending as {sender:016x} from {} (acknowledgements arrive there); resend window: {} \
         datagrams of up to {} B = {:.1} MiB, allocated now",
        cfg.ack_socket.display(),
        cfg.resend_window,
        cfg.datagram_size,
        drain.window_memory() as f64 / (1024.0 * 1024.0)
    );
    Ok(drain)
}

fn new_ring(cfg: &Config) -> Arc<Ring> {
    let ring = Ring::new(cfg.ring_capacity as usize);
    tracing::info!(
        "ring: {} clicks x {} B (+{} B queue stamp) = {:.1} MiB, allocated now",
        ring.capacity(),
        Ring::SLOT_SIZE,
        std::mem::size_of::<usize>(),
        ring.memory() as f64 / (1024.0 * 1024.0)
    );
    Arc::new(ring)
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

    #[tokio::test]
    async fn a_failed_server_task_still_gets_the_drain_and_the_counts_then_its_error() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::default());
        let ring = Arc::new(Ring::new(100));
        for at in 0..10 {
            ring.push("left", at).unwrap();
        }
        // Nobody listens at the path, so the drain can only count the clicks as left.
        let settings = drain::Settings {
            collector: dir.path().join("nobody.sock"),
            ack_socket: dir.path().join("ack.sock"),
            ack_socket_mode: 0o600,
            datagram_limit: protocol::wire::DEFAULT_DATAGRAM,
            window: 16,
            flush_every: Duration::from_secs(3600),
            ack_timeout: Duration::from_secs(2),
        };
        let drain = Drain::new(ring, metrics.clone(), settings, 1).unwrap();
        let (stop_drain, stopped) = watch::channel(None);
        let drain = tokio::spawn(drain.run(stopped));
        let server = tokio::spawn(async { panic!("the http server task fails") });

        let stopping = Stopping {
            server,
            stop_drain,
            drain: Some(drain),
            direct: None,
        };
        let result = shut_down(stopping, Duration::from_millis(50), &metrics).await;
        assert!(matches!(result, Err(Error::Server(_))), "{result:?}");
        assert_eq!(metrics.clicks_dropped.get(Dropped::Shutdown), 10);
    }
}
