//! Several hosts on one database: three redirector + collector pairs, each with its own
//! sockets, admin ports and instance name, all writing to one PostgreSQL at once. Every
//! pair's clicks count, exactly, through a collector restart and compactions.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;
use testkit::redirector::{
    await_rows, collector_with, fixture, load::Load, metric, redirector, LIMIT,
};
use testkit::{eventually, Service};

const PAIRS: usize = 3;

/// One host: its collector (instance `host{i}`) and redirector, and the code its clients ask.
struct Host {
    instance: String,
    socket: PathBuf,
    collector: Service,
    collector_admin: SocketAddr,
    redirector: testkit::redirector::Redirector,
    code: String,
}

async fn start_collector(url: &str, socket: &Path, instance: &str) -> (Service, SocketAddr) {
    let flags = ["--instance", instance, "--compact-interval", "300ms"];
    let (service, admin) = collector_with(url, socket, &flags).await;
    eventually("the collector to be ready", LIMIT, || async {
        let (status, _) = testkit::http::get(admin, "/healthz").await.ok()?;
        (status == 200).then_some(())
    })
    .await;
    (service, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_on_one_database_each_count_every_click_through_a_collector_restart() {
    let codes: Vec<String> = (0..PAIRS).map(|i| format!("host{i}-link")).collect();
    let links: Vec<(&str, &str)> = codes
        .iter()
        .map(|c| (c.as_str(), "https://example.com/"))
        .collect();
    let f = fixture(&links).await;
    let dir = tempfile::tempdir().unwrap();
    let mut hosts = Vec::new();
    for (i, code) in codes.iter().enumerate() {
        let instance = format!("host{i}");
        let socket = dir.path().join(format!("{instance}/collector.sock"));
        let (collector, collector_admin) = start_collector(&f.db.url, &socket, &instance).await;
        let redirector = redirector(&f.db.url, &socket, &[]).await;
        redirector.ready().await;
        hosts.push(Host {
            instance,
            socket,
            collector,
            collector_admin,
            redirector,
            code: code.clone(),
        });
    }

    // Each host's clients count the redirects they got.
    let loads: Vec<Load> = hosts
        .iter()
        .map(|h| {
            let mut load = Load::get(h.redirector.http, &format!("/{}", h.code));
            load.connections = 10;
            load
        })
        .collect();
    let running: Vec<_> = loads.iter().map(Load::start).collect();
    for h in &hosts {
        testkit::redirector::await_first_rows(&f.client, &h.code).await;
    }

    // One host's collector stops and comes back while every host carries load.
    let restarted = &mut hosts[1];
    restarted.collector.signal(Signal::SIGTERM);
    assert!(restarted.collector.wait_exit(LIMIT).await.success());
    let before = testkit::redirector::rows(&f.client, Some(&restarted.code)).await;
    let (collector, admin) =
        start_collector(&f.db.url, &restarted.socket, &restarted.instance).await;
    (restarted.collector, restarted.collector_admin) = (collector, admin);
    eventually(
        "the restarted host's clicks to land again",
        LIMIT,
        || async {
            (testkit::redirector::rows(&f.client, Some(&restarted.code)).await > before + 1_000)
                .then_some(())
        },
    )
    .await;
    let folded = compactions(&hosts).await;
    eventually("a compaction during the load", LIMIT, || async {
        (compactions(&hosts).await > folded).then_some(())
    })
    .await;

    for load in &loads {
        load.stop();
    }
    let mut served = 0;
    for (h, running) in hosts.iter_mut().zip(running) {
        let report = running.await.unwrap();
        let redirects = report.all_redirected(&h.instance);
        h.redirector.service.signal(Signal::SIGTERM);
        assert!(h.redirector.service.wait_exit(LIMIT).await.success());
        let final_counts = testkit::redirector::final_counts(&h.redirector.service.log());
        assert_eq!(
            final_counts,
            (redirects, 0),
            "{}: sent, dropped",
            h.instance
        );
        await_rows(&f.client, Some(&h.code), redirects).await;
        eprintln!("{}: {redirects} redirects, as many rows", h.instance);
        served += redirects;
    }
    assert_eq!(testkit::redirector::rows(&f.client, None).await, served);
    let totals = "SELECT sum(clicks)::int8 FROM click_totals";
    let totals: i64 = f.client.query_one(totals, &[]).await.unwrap().get(0);
    assert_eq!(
        totals as u64, served,
        "click_totals is the sum of every host's clicks"
    );
    eventually(
        "click_counts to hold every click once folded",
        LIMIT,
        || async {
            let sql = "SELECT coalesce(sum(clicks), 0)::int8 FROM click_counts";
            let folded: i64 = f.client.query_one(sql, &[]).await.unwrap().get(0);
            (folded as u64 == served).then_some(())
        },
    )
    .await;
    let instances = "SELECT count(DISTINCT instance) FROM click_writers";
    let instances: i64 = f.client.query_one(instances, &[]).await.unwrap().get(0);
    assert_eq!(instances, PAIRS as i64);
}

/// Compactions done so far, by every collector.
async fn compactions(hosts: &[Host]) -> f64 {
    let mut total = 0.0;
    for h in hosts {
        total += metric(h.collector_admin, "collector_compactions_total").await;
    }
    total
}
