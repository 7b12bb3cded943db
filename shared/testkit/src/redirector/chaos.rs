//! The crash scenario the chaos tests run on the real binaries: redirector + collector pairs
//! under continuous load from clients that count the redirects they got; one collector killed
//! with SIGKILL at three random moments and restarted, PostgreSQL restarted once with
//! `pg_ctl restart -m immediate`, then every redirector stopped with SIGTERM. Every redirect
//! must then be exactly one row, and nothing dropped.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{eventually, Service, XorShift};
use nix::sys::signal::Signal;

use super::load::{Load, Report};
use super::{fixture, metric, redirector, Redirector, LIMIT};
use crate::services::{collector_command, Collector};

/// What varies between the chaos tests.
pub struct Scenario {
    /// Redirector + collector pairs on one database; the first one's collector is killed.
    pub pairs: usize,
    /// Each collector's socket is bound and held by the test, as systemd holds a
    /// `collector.socket` (queue and all) across collector restarts.
    pub activated: bool,
}

/// Codes each pair's clients ask for, so that a click counted twice or lost shows per code.
const CODES_PER_PAIR: usize = 2;
const CONNECTIONS_PER_CODE: usize = 5;

struct Pair {
    instance: String,
    socket: PathBuf,
    /// The socket as "systemd" holds it, when activated.
    held: Option<UnixDatagram>,
    collector: Service,
    admin: SocketAddr,
    redirector: Redirector,
    codes: Vec<String>,
}

/// Random moments that a failure can be replayed with (the seed is printed).
struct Moments(XorShift);

impl Moments {
    /// A pause of 300 ms to 1.5 s.
    fn next(&mut self) -> Duration {
        self.0
            .pause(Duration::from_millis(300), Duration::from_millis(1_200))
    }
}

async fn start_collector(
    url: &str,
    pair_socket: &Path,
    instance: &str,
    held: Option<&UnixDatagram>,
) -> (Service, SocketAddr) {
    let flags = ["--instance", instance, "--compact-interval", "500ms"];
    let cmd = collector_command(url, pair_socket, &flags);
    let cmd = match held {
        Some(socket) => crate::socket_activated(&cmd, socket.as_raw_fd()),
        None => cmd,
    };
    let collector = Collector::spawn(cmd).await;
    collector.ready().await;
    (collector.service, collector.admin)
}

pub async fn crash_and_count(scenario: Scenario) {
    let mut moments = Moments(XorShift::from_clock("chaos"));
    let codes: Vec<Vec<String>> = (0..scenario.pairs)
        .map(|p| {
            (0..CODES_PER_PAIR)
                .map(|c| format!("pair{p}-code{c}"))
                .collect()
        })
        .collect();
    let links: Vec<(&str, &str)> = codes
        .iter()
        .flatten()
        .map(|c| (c.as_str(), "https://example.com/"))
        .collect();
    let f = fixture(&links).await;
    let dir = tempfile::tempdir().unwrap();
    let mut pairs = Vec::new();
    for (p, codes) in codes.into_iter().enumerate() {
        let instance = format!("host{p}");
        let socket = dir.path().join(format!("{instance}/collector.sock"));
        let held = scenario
            .activated
            .then(|| shared::socket::bind_datagram(&socket, 0o600).unwrap());
        let (collector, admin) =
            start_collector(&f.db.url, &socket, &instance, held.as_ref()).await;
        let redirector = redirector(&f.db.url, &socket, &[]).await;
        redirector.ready().await;
        pairs.push(Pair {
            instance,
            socket,
            held,
            collector,
            admin,
            redirector,
            codes,
        });
    }
    let loads: Vec<(String, Load)> = pairs
        .iter()
        .flat_map(|p| {
            p.codes.iter().map(|code| {
                let mut load = Load::get(p.redirector.http, &format!("/{code}"));
                load.connections = CONNECTIONS_PER_CODE;
                (code.clone(), load)
            })
        })
        .collect();
    let running: Vec<_> = loads.iter().map(|(_, l)| l.start()).collect();
    for (code, _) in &loads {
        super::await_first_rows(&f.client, code).await;
    }

    let victim = &mut pairs[0];
    for kill in 1..=3 {
        // How long the load runs before this failure: the scenario's timing, not a wait.
        tokio::time::sleep(moments.next()).await;
        victim.collector.signal(Signal::SIGKILL);
        victim.collector.wait_exit(LIMIT).await;
        let (collector, admin) = start_collector(
            &f.db.url,
            &victim.socket,
            &victim.instance,
            victim.held.as_ref(),
        )
        .await;
        (victim.collector, victim.admin) = (collector, admin);
        eprintln!(
            "chaos: collector of {} killed and restarted ({kill} of 3)",
            victim.instance
        );
        if kill == 2 {
            tokio::time::sleep(moments.next()).await;
            tokio::task::spawn_blocking(|| crate::pgtest::cluster().restart_immediately())
                .await
                .unwrap();
            eprintln!("chaos: PostgreSQL restarted with -m immediate");
        }
    }
    // Clicks flow again through every pair after the last failure.
    let client = crate::pgtest::connect(&f.db.url).await;
    for (code, _) in &loads {
        let before = super::rows(&client, Some(code)).await;
        eventually("clicks to land again after the failures", LIMIT, || async {
            (super::rows(&client, Some(code)).await > before).then_some(())
        })
        .await;
    }

    for (_, load) in &loads {
        load.stop();
    }
    let mut reports = Vec::new();
    for running in running {
        reports.push(running.await.unwrap());
    }
    let resends = metric(pairs[0].redirector.admin, "redirector_resends_total").await;
    let mut served = 0;
    for pair in &mut pairs {
        let redirects = stop_redirector(pair, &loads, &reports).await;
        served += redirects;
    }
    for ((code, _), report) in loads.iter().zip(&reports) {
        super::await_rows(&client, Some(code), report.count(302)).await;
    }
    assert_eq!(super::rows(&client, None).await, served);
    let totals = "SELECT sum(clicks)::int8 FROM click_totals";
    let totals: i64 = client.query_one(totals, &[]).await.unwrap().get(0);
    assert_eq!(totals as u64, served, "click_totals agrees with the rows");
    assert!(
        resends > 0.0,
        "the killed collector's datagrams were sent again"
    );
    eprintln!("chaos: {served} redirects, as many rows; {resends} datagrams resent");
    drop(dir);
}

/// SIGTERMs the pair's redirector and checks its final line: everything its clients got was
/// sent, acknowledged, and nothing dropped. Returns its redirects.
async fn stop_redirector(pair: &mut Pair, loads: &[(String, Load)], reports: &[Report]) -> u64 {
    let redirects: u64 = loads
        .iter()
        .zip(reports)
        .filter(|((code, _), _)| pair.codes.contains(code))
        .map(|(_, report)| {
            assert_eq!(report.errors, 0, "{report:?}");
            assert_eq!(report.count(302), report.total(), "{report:?}");
            report.count(302)
        })
        .sum();
    pair.redirector.service.signal(Signal::SIGTERM);
    assert!(pair.redirector.service.wait_exit(LIMIT).await.success());
    let log = pair.redirector.service.log();
    assert_eq!(
        super::final_counts(&log),
        (redirects, 0),
        "{}: sent, dropped",
        pair.instance
    );
    let acked = format!("; {redirects} acknowledged, 0 not acknowledged");
    assert!(
        log.iter().any(|l| l.contains(&acked)),
        "{}: {acked:?} in {log:#?}",
        pair.instance
    );
    redirects
}
