//! The services as the tests run them: the real binaries on ephemeral admin ports, and what
//! their `/metrics` say.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use super::{binary, eventually, http, Service, LIMIT};

/// The collector's command line for `database_url` and `socket`, admin on an ephemeral port,
/// `extra` flags last. The environment's socket activation and systemd variables are removed,
/// so that only the command line says where the collector listens.
pub fn collector_command(database_url: &str, socket: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(binary("collector"));
    cmd.arg("--database-url")
        .arg(database_url)
        .arg("--socket")
        .arg(socket)
        .args(["--admin-listen", "127.0.0.1:0"])
        .args(extra)
        .env("RUST_LOG", "info")
        .env_remove("CLICKS_SOCKET")
        .env_remove("LISTEN_FDS")
        .env_remove("NOTIFY_SOCKET");
    cmd
}

/// A running collector binary and its admin address.
pub struct Collector {
    pub service: Service,
    pub admin: SocketAddr,
}

impl Collector {
    /// Starts the collector on `socket` for `database_url` with `extra` flags, and waits until
    /// `/healthz` says it is ready.
    pub async fn start(database_url: &str, socket: &Path, extra: &[&str]) -> Collector {
        let collector = Collector::spawn(collector_command(database_url, socket, extra)).await;
        collector.ready().await;
        collector
    }

    /// Spawns `cmd` and learns the admin address from the log.
    pub async fn spawn(cmd: Command) -> Collector {
        let service = Service::spawn("collector", cmd);
        let admin = service.addr_after("admin listening on ", LIMIT).await;
        Collector { service, admin }
    }

    /// Waits until `/healthz` answers 200.
    pub async fn ready(&self) {
        await_healthy("collector", self.admin).await;
    }

    /// The status `/healthz` answers now.
    pub async fn health(&self) -> u16 {
        http::get(self.admin, "/healthz")
            .await
            .expect("GET /healthz")
            .0
    }

    pub async fn metrics(&self) -> String {
        http::get(self.admin, "/metrics")
            .await
            .expect("GET /metrics")
            .1
    }

    /// One sample of `/metrics`, e.g. `collector_datagrams_duplicate_total`.
    pub async fn metric(&self, series: &str) -> f64 {
        metric(self.admin, series).await
    }

    /// Waits until the metric reaches `value`, and checks it went no further.
    pub async fn await_metric(&self, series: &str, value: f64) {
        await_metric(self.admin, series, value).await;
    }
}

/// Waits until the metric of the admin listener at `admin` reaches `value`, and checks it
/// went no further.
pub async fn await_metric(admin: SocketAddr, series: &str, value: f64) {
    let what = format!("{series} to reach {value}");
    eventually(&what, LIMIT, || async {
        (metric(admin, series).await >= value).then_some(())
    })
    .await;
    assert_eq!(metric(admin, series).await, value, "{series}");
}

/// Waits until the admin listener at `admin` says 200 on `/healthz`.
pub async fn await_healthy(name: &str, admin: SocketAddr) {
    let what = format!("{name} /healthz to answer 200");
    eventually(&what, LIMIT, || async {
        let (status, _) = http::get(admin, "/healthz").await.ok()?;
        (status == 200).then_some(())
    })
    .await;
}

/// One sample of the `/metrics` at `admin`; panics if the series is missing.
pub async fn metric(admin: SocketAddr, series: &str) -> f64 {
    let (status, body) = http::get(admin, "/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    shared::metrics::sample(&body, series).unwrap_or_else(|| panic!("no {series} in:\n{body}"))
}
